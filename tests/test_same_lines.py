"""Identical lines from several ranks said once, by default, in a real kernel: text mode's
stream and the widget view's "all ranks" pane (--same-lines merge); apart with --same-lines
apart. (The transcript's merged sections: tests/test_unit_samelines.py.)"""
import json
import os

import pytest

from kernel import Kernel

pytestmark = pytest.mark.kernel

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


def test_text_mode_says_a_line_every_rank_printed_once_and_different_lines_apart(default_kernel):
    reply = default_kernel.ok(CELL.replace("{options}", "--output text"), timeout=180)
    out = reply.stdout
    assert out.count("epoch 1 done") == 1 and "[ranks 0–3]:epoch 1 done\n" in out, out
    assert out.count("epoch 2 done") == 1 and "[ranks 0–3]:epoch 2 done\n" in out, out
    assert all(f"[rank{r}]:rank {r} loss 0.{r}\n" in out for r in range(4)), out
    assert out.index("epoch 1 done") < out.index("loss") < out.index("epoch 2 done")


def test_apart_shows_every_ranks_line(default_kernel):
    out = default_kernel.ok(CELL.replace("{options}", "--output text --same-lines apart"), timeout=180).stdout
    assert all(f"[rank{r}]:epoch 1 done\n" in out for r in range(4)), out


def test_the_widget_views_all_ranks_pane_says_it_once(default_kernel):
    msg_id = default_kernel.kc.execute(CELL.replace("{options}", "--output widgets"))
    values = []
    while True:
        msg = default_kernel.kc.get_iopub_msg(timeout=180)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("comm_open", "comm_msg"):
            state = msg["content"].get("data", {}).get("state", {})
            if isinstance(state.get("value"), str):
                values.append(state["value"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    panes = "\n".join(values)
    assert "[ranks 0–3]: epoch 1 done" in panes and "[ranks 0–3]: epoch 2 done" in panes, json.dumps(values)[:3000]
    assert "[rank2]: rank 2 loss 0.2" in panes
