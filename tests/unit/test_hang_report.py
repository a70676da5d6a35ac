"""A hang's report, said once: the DDPTimeout's text (each fact once, wrapped between words, no
countdown, nothing a view already showed) and the idle warning's wording. Pure."""
import re

from nbddp.core import diagnosis
from nbddp.core.result import DDPTimeout, RankResult, RunResult
from nbddp.core.states import RankState


def rank(r, state, **kw):
    return RankResult(rank=r, local_rank=r, node_rank=0, state=state, **kw)


def _hung_result(displayed=()):
    ranks = [rank(0, RankState.TIMED_OUT, blocked_at="cell line 7: dist.all_reduce(t) (in all_reduce)"),
             rank(1, RankState.TIMED_OUT, blocked_at="cell line 8: dist.barrier() (in barrier)")]
    res = RunResult(ranks=ranks, world_size=2, log_dir="/logs/7", started_at=0.0, ended_at=21.0,
                    timed_out=True, displayed=list(displayed))
    res.notes = [diagnosis.idle_report(6, res, ranks, timeout=20), diagnosis.timeout_report(20, res)]
    return res


def _plain(lines):
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for text in lines for line in text.split("\n")]


def test_a_timeout_says_each_fact_once_wrapped_between_words_without_a_countdown():
    res = _hung_result()
    lines = _plain(DDPTimeout(res)._render_traceback_())
    text = "\n".join(lines)
    assert lines[0] == "DDPTimeout: timed out after 20 s", lines
    for fact in ("rank 0 blocked at cell line 7: dist.all_reduce(t) (in all_reduce)",
                 "rank 1 blocked at cell line 8: dist.barrier() (in barrier)",
                 "Hint: the ranks are not all in the same collective", "timed out after"):
        assert text.count(fact) == 1, (fact, text)
    assert "no output from any rank" not in text and "stops the cell in" not in text, text
    assert all(len(line) <= 100 for line in lines), text   # JupyterLab would break longer ones mid-word


def test_a_timeout_a_view_showed_is_not_repeated_by_the_error():
    text = "\n".join(_plain(DDPTimeout(_hung_result(displayed=[0, 1]))._render_traceback_()))
    assert "blocked at" not in text and "Hint" not in text, text
    assert "where each rank waited: nbddp's note above" in text and text.startswith("DDPTimeout: timed out after 20 s")


def test_the_idle_warning_says_the_timeout_in_words_that_stay_true():
    note = _hung_result().notes[0]
    assert note.endswith("(--timeout 20 stops the cell 20 s after it started)"), note
