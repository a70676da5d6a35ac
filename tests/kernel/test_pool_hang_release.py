"""A pool keeps its ranks and their state through a collective that hangs (#40): on --timeout or
the stop button, ranks blocked in C after SIGINT are released by closing their process group's
connections (nbddp/rank/release.py); the cell raises on them (``Released``, at the cell's line),
the next cell says once that the group must be created again, and training goes on with the
model the earlier cells trained. A rank that even the release cannot free ends the pool as before."""
import time

import pytest

from support.helpers import alive

SETUP = ("import torch, torch.distributed as dist\ndist.init_process_group('gloo')\nrank = dist.get_rank()\n"
         "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)")
TRAIN = ("for _ in range(3):\n    opt.zero_grad(); model(torch.ones(2, 4) * (rank + 1)).sum().backward()\n"
         "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n    opt.step()\n"
         "print('trained', round(model.weight.sum().item(), 4))")
HANG = "t = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(t)\nprint('past the if on', rank)"
PIDS = ("%%local\nimport json; _pool = type(get_ipython().find_magic('ddp_pool').__self__).pool\n"
        "print('PIDS', json.dumps([r.result.pid for r in _pool.ranks]))")


def _pids(k):
    import json

    return json.loads(k.ok(PIDS).stdout.split("PIDS ", 1)[1])


def _trained(text):
    return sorted(line.split("trained ", 1)[1] for line in text.splitlines() if "trained " in line)


@pytest.fixture
def pool(kernel):
    said = kernel.ok("%ddp_pool start -n 2 --output text --same-lines apart --timeout 3 --all-cells").stdout
    assert "each cell times out after 3 s unless it gives --timeout" in said
    kernel.ok(SETUP)
    yield kernel
    kernel.execute("%ddp_pool stop")


def test_a_timed_out_collective_costs_one_cell_not_the_model(pool):
    k = pool
    before = _trained(k.ok(TRAIN).stdout)
    assert len(before) == 2 and before[0] == before[1]  # both ranks hold the same model
    pids = _pids(k)
    k.ok("w = model.weight.detach().clone()")
    began = time.monotonic()
    reply = k.execute(HANG, timeout=60)  # the pool's --timeout 3
    took = time.monotonic() - began
    assert reply.status == "error" and reply.error["ename"] == "DDPTimeout", reply.text
    assert "rank 0: timed out (released from a blocked collective" in "\n".join(reply.error["traceback"])
    assert "Released: nbddp released this rank from a collective" in reply.plain
    assert ", line 3" in reply.plain and "Connection closed by peer" not in reply.plain
    assert took < 15, took
    assert alive(pids) == pids
    reply = k.ok("print('kept', torch.equal(model.weight, w), dist.is_initialized())")
    assert reply.stdout.count("kept True False") == 2, reply.stdout
    assert "create it again (dist.init_process_group)" in reply.text
    k.ok("dist.init_process_group('gloo')")
    after = _trained(k.ok(TRAIN).stdout)
    assert len(after) == 2 and after[0] == after[1] and after != before  # trained on from there
    assert "ready" in k.ok("%ddp_pool status").stdout
    assert _pids(k) == pids


def test_the_stop_button_releases_a_hung_collective_and_keeps_the_pool(pool):
    k = pool
    pids = _pids(k)
    msg_id = k.kc.execute(f"%%ddp --timeout 60\n{HANG}")  # its own --timeout: the stop button comes first
    seen = {}

    def on_output(reply):
        if "past the if on 1" in reply.stdout and "t" not in seen:
            seen["t"] = time.monotonic()
            time.sleep(0.5)  # rank 0 is in the all_reduce by now
            k.km.interrupt_kernel()

    reply = k.collect(msg_id, timeout=60, on_output=on_output)
    assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply.text
    assert "nbddp released this rank from a collective" in reply.text
    assert "closes the process group's connections to release it" in reply.text
    assert time.monotonic() - seen["t"] < 8
    assert alive(pids) == pids
    k.ok("dist.init_process_group('gloo')")
    assert k.ok("t = torch.ones(1); dist.all_reduce(t); print('sum', t.item())").stdout.count("sum 2.0") == 2


def test_a_rank_the_release_cannot_free_ends_the_pool_as_before(pool):
    k = pool
    pids = _pids(k)
    reply = k.execute("%%ddp --timeout 2\nimport signal, time\n"
                      "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
                      "if rank == 0:\n    time.sleep(60)", timeout=60)
    assert reply.status == "error"
    assert "rank 0 did not return even then (not blocked on the process group): the pool is ended" in reply.text
    status = k.ok("%ddp_pool status").stdout
    assert "broken: rank 0 did not stop after SIGINT" in status, status
    assert not alive(pids[:1])
