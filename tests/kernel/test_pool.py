"""Persistent pool in a real kernel: state across cells, targeting, push/pull, rank death,
restart, interrupt, and no process left behind."""
import json
import time

import pytest

from support.helpers import alive, wait_gone


def _pids(kernel):
    """The pids of the pool's ranks ([] when no pool was started)."""
    return json.loads(kernel.ok("import json; _pool = type(get_ipython().find_magic('ddp_pool').__self__).pool\n"
                                "print(json.dumps([r.result.pid for r in _pool.ranks] if _pool else []))").stdout)


@pytest.fixture
def pool_kernel(kernel):
    """The module's kernel with a pool of 3 started for the test. After it the pool is stopped,
    every rank it had (restarts included) must be gone and the test's names are dropped, so the
    next test starts its own pool in the same kernel, as a user does after `%ddp_pool stop`."""
    kernel.ok("%ddp_pool start -n 3 --output text")
    seen = set(_pids(kernel))
    yield kernel
    seen |= set(_pids(kernel))  # a restart's ranks too
    kernel.execute("%ddp_pool stop")
    kernel.ok("%reset -f")
    assert not wait_gone(sorted(seen), 10), "a pool's rank outlived %ddp_pool stop"


def test_state_kept_across_cells_and_pull(pool_kernel):
    k = pool_kernel
    k.ok("%%ddp\nimport torch, torch.distributed as dist, os\ndist.init_process_group('gloo')\n"
         "rank = dist.get_rank(); model = torch.nn.Linear(2, 1); history = []")
    for _ in range(3):
        k.ok("%%ddp\nt = torch.ones(1) * (rank + 1); dist.all_reduce(t); history.append(t.item())")
    k.ok("%%ddp --pull history\npass")
    k.ok("assert history == [[6.0, 6.0, 6.0]] * 3, history")
    k.ok("%%ddp --pull rank@2\npass")
    k.ok("assert rank == 2, rank")
    pids = _pids(k)
    reply = k.ok("%%ddp\nimport os; print('pid', os.getpid())")
    for pid in pids:
        assert f"pid {pid}" in reply.stdout  # the same processes served every cell
    k.ok("%ddp_pool stop")
    assert not wait_gone(pids, 5)


def test_push_tensor_function_and_class(pool_kernel):
    k = pool_kernel
    k.ok("import torch\nW = torch.arange(6.).reshape(2, 3)\nOFFSET = 0.5\n"
         "def scale(x):\n    return x * 2 + OFFSET\n"
         "class Box:\n    def __init__(self, v): self.v = v\n    def twice(self): return self.v * 2\n"
         "box = Box(21)")
    k.ok("%%ddp --push W,scale,Box,box --pull out\nout = (scale(W).sum().item(), box.twice(), Box(1).twice())")
    k.ok("assert out == [(33.0, 42, 2)] * 3, out")


def test_unserializable_push_names_the_object(pool_kernel):
    reply = pool_kernel.execute("gen = (i for i in range(3))\n")
    reply = pool_kernel.execute("%%ddp --push gen\npass")
    assert reply.error and "cannot push 'gen'" in reply.error["evalue"], reply
    reply = pool_kernel.execute("%%ddp --push missing_name\npass")
    assert reply.status == "error" and "--push missing_name: no such name" in reply.stderr
    pool_kernel.ok("%%ddp\nprint('still fine')")


def test_targeting_runs_on_some_ranks_and_warns_about_collectives(pool_kernel):
    k = pool_kernel
    reply = k.ok("%%ddp --ranks 0,2\nimport os; print('here', os.environ['RANK'])")
    assert "[rank0]:here 0" in reply.stdout and "[rank2]:here 2" in reply.stdout
    assert "[rank1]:" not in reply.stdout
    k.ok("%%ddp\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')\nx = torch.ones(1)")
    start = time.monotonic()
    reply = k.execute("%%ddp --ranks 0 --timeout 3\ndist.all_reduce(x)", timeout=60)
    assert reply.error and reply.error["ename"] == "DDPTimeout", reply
    text = reply.stderr + "\n".join(reply.error["traceback"])
    assert "runs on rank 0 only, but calls all_reduce() (cell line 2)" in text
    assert "rank 0 blocked at cell line 2: dist.all_reduce(x)" in text
    assert time.monotonic() - start < 15
    # the hung collective was released (tests/kernel/test_pool_hang_release.py): the pool serves on, the
    # group is to be created again
    assert "ready" in k.ok("%ddp_pool status").stdout
    reply = k.ok("%%ddp\nprint('back', dist.is_initialized())")
    assert reply.stdout.count("]:back False\n") == 3 and "create it again" in reply.text


def test_rank_death_breaks_pool_restart_brings_clean_one(pool_kernel):
    k = pool_kernel
    old = _pids(k)
    reply = k.execute("%%ddp --ranks 1\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)", timeout=60)
    assert reply.error and reply.error["ename"] == "DDPError"
    assert "rank 1: killed (killed by SIGKILL" in "\n".join(reply.error["traceback"])
    assert "broken: rank 1" in k.ok("%ddp_pool status").stdout
    assert not wait_gone(old, 5), "the broken pool's other ranks must be ended"
    k.ok("%ddp_pool restart")
    new = _pids(k)
    assert not set(new) & set(old)
    reply = k.ok("%%ddp\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                 "t = torch.ones(1); dist.all_reduce(t); print('sum', t.item())")
    assert reply.stdout.count("sum 3.0") == 3


def test_exception_on_one_rank_keeps_pool_when_others_finish(pool_kernel):
    k = pool_kernel
    reply = k.execute("%%ddp\nimport os\nif os.environ['RANK'] == '2':\n    raise KeyError('k')\nvalue = 7")
    assert reply.error and "rank 2: failed (KeyError: 'k' at cell line 4)" in "\n".join(reply.error["traceback"])
    assert "ready" in k.ok("%ddp_pool status").stdout
    k.ok("%%ddp --ranks 0 --pull value@0\npass")
    k.ok("assert value == 7")


def test_interrupt_stops_the_cell_but_keeps_the_pool(pool_kernel):
    k = pool_kernel
    k.ok("%%ddp\ncounter = 41")
    pids = _pids(k)
    reply, pressed = k.interrupted_when("%%ddp\nimport time\nprint('looping', flush=True)\nwhile True:\n"
                                        "    time.sleep(0.01)", lambda r: r.stdout.count("looping") == 3)
    assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply
    assert time.monotonic() - pressed < 3.0
    assert alive(pids) == pids  # the workers survived
    k.ok("%%ddp --pull counter@1\ncounter += 1")
    k.ok("assert counter == 42")


def test_fresh_cell_while_pool_runs_and_shape_mismatch(pool_kernel):
    k = pool_kernel
    reply = k.ok("%%ddp --fresh -n 2\nimport os; print('fresh', os.environ['WORLD_SIZE'])")
    assert reply.stdout.count("fresh 2") == 2
    reply = k.execute("%%ddp -n 2\npass")
    assert reply.status == "error" and "a pool of 3 ranks is running" in reply.stderr


def test_restart_help_only_prints_it_and_the_pool_takes_no_other_launcher(pool_kernel):
    k = pool_kernel
    pids = _pids(k)
    reply = k.ok("%ddp_pool restart -h")
    assert "usage: %%ddp" in reply.stdout and "nbddp pool:" not in reply.stdout, reply.stdout
    reply = k.execute("%ddp_pool restart --launcher torchrun -n 2")
    assert reply.status == "error" and reply.stderr.startswith(
        "UsageError: %ddp_pool: a pool runs on the local launcher only, not --launcher torchrun"), reply.stderr
    assert _pids(k) == pids and alive(pids) == pids  # the same 3 ranks serve on
    assert "3 ranks (1 node x 3), ready" in k.ok("%ddp_pool status").stdout
    # from Python, the same entry as nbddp.run: the pool's ranks, shown as text
    reply = k.ok("pool = type(get_ipython().find_magic('ddp_pool').__self__).pool\n"
                 "r = pool.run('import os; print(\"on\", os.getpid())', ranks=[1])\n"
                 "assert [x.state for x in r.ranks] == ['ok'] * 3, r.summary()")
    assert f"[rank1]:on {pids[1]}" in reply.stdout, reply.text


def test_after_reset_pools_and_fresh_forks_still_start(kernel):
    """``%reset`` empties the notebook's namespace, ``__spec__`` with it, which multiprocess
    reads on every start: pool starts and fresh forks raised AttributeError after it."""
    kernel.ok("%%ddp -n 2 --output text\npass")  # spares for 2 wait for the next cell
    kernel.ok("%reset -f")
    reply = kernel.ok("%%ddp -n 4 --output text\nimport os; print('after reset', os.environ['RANK'])")
    assert all(f"[rank{r}]:after reset {r}" in reply.stdout for r in range(4)), reply.stdout  # 2 spares, 2 forks
    kernel.ok("%ddp_pool start -n 2 --output text")
    try:
        reply = kernel.ok("%%ddp\nimport os; print('pool after reset', os.environ['RANK'])")
        assert all(f"[rank{r}]:pool after reset {r}" in reply.stdout for r in range(2)), reply.stdout
    finally:
        kernel.execute("%ddp_pool stop")


def test_kernel_shutdown_ends_the_pool(fresh_kernel):
    fresh_kernel.ok("%ddp_pool start -n 2")
    pids = _pids(fresh_kernel)
    assert alive(pids) == pids
    fresh_kernel.km.shutdown_kernel(now=False)
    assert not wait_gone(pids, 10)


def test_bad_pool_commands(kernel):
    for line, text in (("", "usage"), ("launch", "unknown command 'launch'"), ("start -n 0", "-n must be at least 1")):
        reply = kernel.execute(f"%ddp_pool {line}")
        assert reply.status == "error" and text in reply.stderr, (line, reply)
