"""Debugging one rank from the notebook (nbddp/rank/asking.py, nbddp/sources/asking.py,
nbddp/kernel/inputbox.py): a rank's pdb prompt and input() go to the notebook's input box, as
``input()`` in a plain cell does. Each test drives a real kernel as a front end with an input
box does (jupyter_client: allow_stdin, input_request / input_reply), with real ranks."""
from __future__ import annotations

import psutil
import pytest

from kernel import worker_pids

pytestmark = pytest.mark.kernel

BREAK_ON_RANK_1 = """%%ddp -n 2
import os, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = 10 * rank
if rank == 1:
    breakpoint()
    y = x + 1
dist.barrier()
print(f"rank {rank} done")
dist.destroy_process_group()
"""


def scripted(*lines):
    """An answer function that types ``lines`` in order, one per prompt, then ``c``."""
    todo = list(lines)

    def answer(prompt, reply):
        return todo.pop(0) if todo else "c"
    return answer


def test_breakpoint_on_rank_1_p_n_c_then_the_cell_ends_ok(kernel):
    reply = kernel.converse(BREAK_ON_RANK_1, scripted("p x", "n", "p y", "c"), timeout=120)
    assert reply.status == "ok", reply.text + str(reply.error)
    assert reply.prompts[:4] == ["(Pdb rank 1) "] * 4, reply.prompts
    assert "[rank1]:10" in reply.text, reply.text         # p x
    assert "[rank1]:11" in reply.text, reply.text         # after n: p y
    assert "rank 0 done" in reply.text and "rank 1 done" in reply.text, reply.text
    assert "rank 1 is in the debugger" in reply.text, reply.text
