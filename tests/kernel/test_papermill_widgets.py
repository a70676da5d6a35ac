"""A papermill-run notebook keeps each rank's lines once (the text view's streamed lines, or the
widget view's per-rank transcript), a text/html and text/plain status for both views, and a valid
metadata.widgets (with its "state" key) or none."""
import json
import os

import nbformat

from support.helpers import run_with_papermill

CELLS = [
    "%load_ext nbddp",
    "%%ddp -n 2\nimport os, sys\nprint('auto says', os.environ['RANK'])\n"
    "print('auto err', os.environ['RANK'], file=sys.stderr)",
    "%%ddp -n 2 --output widgets\nimport os\nprint('widget says', os.environ['RANK'])",
    "print(_ddp.ok, [r.state for r in _ddp.ranks])",
]


def _transcripts(cell):
    return [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")
            and "text/html" in o.data and "text/plain" in o.data and "nbddp" in o.data["text/plain"]]


def test_papermill_notebook_has_per_rank_transcript_and_valid_widget_state(tmp_path):
    out, dst = run_with_papermill(CELLS, tmp_path)
    nbformat.validate(out)
    with open(dst) as f:
        raw = json.load(f)
    widgets = raw["metadata"].get("widgets")
    if widgets is not None:  # GitHub refuses notebooks whose widget metadata lacks "state"
        state = widgets["application/vnd.jupyter.widget-state+json"]
        assert isinstance(state["state"], dict) and state["version_major"] == 2
    for index, word in ((1, "auto"), (2, "widget")):
        cell = out.cells[index]
        (shown,) = _transcripts(cell)
        streamed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        for r in (0, 1):
            # each line once: text mode streams the prefixed lines (papermill --log-output shows
            # them live) and its transcript is the status; the widget view's transcript has them
            said = [streamed.count(f"{word} says {r}"), shown.data["text/plain"].count(f"{word} says {r}"),
                    shown.data["text/html"].count(f"{word} says {r}")]
            assert said == ([1, 0, 0] if word == "auto" else [0, 1, 1]), (said, streamed, shown.data["text/plain"])
            assert f"rank {r}: ok" in shown.data["text/plain"] and f"rank {r}: ok" in shown.data["text/html"]
    assert "[rank0]:auto says 0" in "".join(o.get("text", "") for o in out.cells[1].outputs
                                            if o.output_type == "stream")
    assert "[rank1]:auto err 1" in "".join(o.get("text", "") for o in out.cells[1].outputs
                                          if o.output_type == "stream" and o.name == "stderr")
    assert "True ['ok', 'ok']" in "".join(o.get("text", "") for o in out.cells[3].outputs)
    print("metadata.widgets:", "absent" if widgets is None else
          f"{len(widgets['application/vnd.jupyter.widget-state+json']['state'])} models")
    assert os.path.getsize(dst) < 2_000_000
