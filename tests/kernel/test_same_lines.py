"""Identical lines from several ranks said once, by default, in a real kernel: text mode's
stream and the widget view's "all ranks" pane (--same-lines merge); apart with --same-lines
apart. (The transcript's merged sections, and exactly which lines merge for a given timing:
tests/unit/test_same_lines_rules.py.)

Which ranks share a line depends on when the kernel reads each rank's pipe: a rank the machine
left unscheduled for longer than the hold (0.5 s), or whose earlier line the kernel read after
its peers' next one, gets its line apart (as on a loaded machine). So these tests check what
always holds: every rank's lines, each once, in the rank's own order; some said once for
several ranks with merge, none with apart.
"""
import json
import os
import re

import pytest

from support.kernel import Kernel

CELL = """%%ddp -n 4 {options}
import os, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print("epoch 1 done", flush=True)
dist.barrier()
print(f"rank {rank} loss 0.{rank}", flush=True)
dist.barrier()
print("epoch 2 done", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def default_kernel(tmp_path_factory):
    """A kernel as users get it: no NBDDP_SAME_LINES (the suite's conftest sets apart)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NBDDP_SAME_LINES", "NBDDP_OUTPUT")}
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")), env=env).load_nbddp()
    yield k
    k.shutdown()


PREFIX = re.compile(r"^\[ranks? ?([0-9–,]+)\]: ?(.*)$")


def _ranks(text: str) -> list[int]:
    """'0–2,5' → [0, 1, 2, 5] (summary.label's ranges, read back)."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("–")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def said(text: str) -> tuple[dict, list]:
    """Each rank's lines in the order shown, and the lines said once for several ranks."""
    per_rank, shared = {r: [] for r in range(4)}, []
    for line in text.splitlines():
        m = PREFIX.match(line)
        if m:
            ranks = _ranks(m.group(1))
            if len(ranks) > 1:
                shared.append(m.group(2))
            for r in ranks:
                per_rank[r].append(m.group(2))
    return per_rank, shared


def assert_every_line_once_in_order(per_rank, shown):
    for r in range(4):
        assert per_rank[r] == ["epoch 1 done", f"rank {r} loss 0.{r}", "epoch 2 done"], shown


def test_text_mode_says_a_line_every_rank_printed_once_and_different_lines_apart(default_kernel):
    out = default_kernel.ok(CELL.replace("{options}", "--output text"), timeout=180).stdout
    per_rank, shared = said(out)
    assert_every_line_once_in_order(per_rank, out)
    # all four at once: tests/unit/test_same_lines_rules.py
    assert shared and set(shared) <= {"epoch 1 done", "epoch 2 done"}, out


def test_apart_shows_every_ranks_line(default_kernel):
    out = default_kernel.ok(CELL.replace("{options}", "--output text --same-lines apart"), timeout=180).stdout
    per_rank, shared = said(out)
    assert_every_line_once_in_order(per_rank, out)
    assert not shared, out


def test_the_widget_views_all_ranks_pane_says_it_once(default_kernel):
    reply = default_kernel.ok(CELL.replace("{options}", "--output widgets"), timeout=180)
    values = [v for state in reply.states if isinstance(v := state.get("value"), str)]
    # the all-ranks pane: its blocks' latest values, the ones whose lines carry a rank prefix
    blocks = [v for v in values if "[rank" in v]
    pane = re.sub(r"<[^>]+>", "", max(blocks, key=len)) if blocks else ""
    per_rank, shared = said(pane)
    assert_every_line_once_in_order(per_rank, json.dumps(values)[:3000])
    assert shared and set(shared) <= {"epoch 1 done", "epoch 2 done"}, json.dumps(values)[:3000]
