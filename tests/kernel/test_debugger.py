"""Debugging one rank from the notebook (nbddp/rank/asking.py, nbddp/sources/asking.py,
nbddp/kernel/inputbox.py): a rank's pdb prompt and input() go to the notebook's input box, as
``input()`` in a plain cell does. Each test drives a real kernel as a front end with an input
box does (jupyter_client: allow_stdin, input_request / input_reply), with real ranks."""
from __future__ import annotations

from support.kernel import worker_pids

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


def test_two_ranks_at_breakpoints_are_served_one_after_the_other(kernel):
    """Both ranks stop; the first keeps the input box until it continues, the other is named
    as waiting meanwhile, then gets its turn."""
    def answer(prompt, reply):
        first = reply.prompts[0]
        if prompt == first and "waits for it" not in reply.text and len(reply.prompts) < 2000:
            return "p rank"   # the first rank stays at its prompt until the other is seen waiting
        return "p rank" if reply.prompts.count(prompt) == 1 else "c"

    reply = kernel.converse("%%ddp -n 2\nimport os\nrank = int(os.environ['RANK'])\nbreakpoint()\n"
                            "print(f'rank {rank} went on')", answer, timeout=120)
    assert reply.status == "ok", reply.text + str(reply.error)
    order = [p for i, p in enumerate(reply.prompts) if i == 0 or p != reply.prompts[i - 1]]
    assert sorted(order) == ["(Pdb rank 0) ", "(Pdb rank 1) "], reply.prompts  # one switch only
    first, second = (int(p.split()[2].rstrip(")")) for p in order)
    assert f"rank {first} is in the debugger (answer in the input box); rank {second} waits for it" \
        in reply.text, reply.text
    assert f"rank {second} is in the debugger" in reply.text, reply.text
    assert "rank 0 went on" in reply.text and "rank 1 went on" in reply.text, reply.text


def test_q_stops_the_launch_fail_fast_and_leaves_nothing_running(kernel):
    reply = kernel.converse("%%ddp -n 2\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
                            "if dist.get_rank() == 1:\n    breakpoint()\ndist.barrier()", scripted("q"),
                            timeout=120)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    text = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (quit in the debugger at cell line 6)" in text, text
    # rank 0 waited in the barrier: fail-fast's SIGTERM, or gloo saw rank 1 go first
    assert ("rank 0: terminated (stopped by nbddp after rank 1 failed)" in text
            or "Connection closed by peer" in text), text
    assert reply.prompts == ["(Pdb rank 1) "], reply.prompts
    assert worker_pids(kernel) == []


def test_pdb_opens_the_first_failing_rank_at_its_failing_frame(kernel):
    """--pdb: post-mortem in the frame that raised, while the other rank waits in a collective;
    fail-fast stops it once the debugger is left."""
    cell = ("%%ddp -n 2 --pdb\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
            "def step(v):\n    bad = v * 2\n    raise ValueError(f'bad value {bad}')\n"
            "if dist.get_rank() == 1:\n    step(21)\ndist.barrier()")
    reply = kernel.converse(cell, scripted("p bad", "p v", "q"), timeout=120)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    text = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (ValueError: bad value 42 at cell line 6)" in text, text
    assert ("rank 0: terminated (stopped by nbddp after rank 1 failed)" in text
            or "Connection closed by peer" in text), text
    assert reply.prompts == ["(Pdb rank 1) "] * 3, reply.prompts
    assert "[rank1]:42\n" in reply.text and "[rank1]:21\n" in reply.text, reply.text
    assert worker_pids(kernel) == []


def test_input_in_a_rank_asks_in_the_notebook_naming_the_rank(kernel):
    reply = kernel.converse("%%ddp -n 2\nimport os, sys\nif os.environ['RANK'] == '1':\n"
                            "    lr = float(input('lr? '))\n    print('got', lr * 2)\n"
                            "    print('line', repr(sys.stdin.readline()))",
                            lambda p, r: "0.25" if "lr" in p else "from stdin")
    assert reply.status == "ok", reply.text + str(reply.error)
    assert reply.prompts == ["[rank 1] lr? ", "[rank 1] "], reply.prompts
    assert "[rank1]:got 0.5" in reply.text and "[rank1]:line 'from stdin\\n'" in reply.text, reply.text


def test_time_at_the_prompt_is_not_a_timeout_nor_a_hang(kernel):
    """--timeout 3 and --idle-warning 1 while the user stays 5 s in the debugger (answering
    `p 1` again and again): neither fires; the cell ends ok."""
    import time

    start = []

    def answer(prompt, reply):
        start.append(time.monotonic())
        return "p 1" if time.monotonic() - start[0] < 5 else "c"

    reply = kernel.converse("%%ddp -n 2 --timeout 3 --idle-warning 1\nimport torch.distributed as dist\n"
                            "dist.init_process_group('gloo')\nif dist.get_rank() == 0:\n    breakpoint()\n"
                            "dist.barrier()\nprint('after', dist.get_rank())", answer, timeout=120)
    assert reply.status == "ok", reply.text + str(reply.error)
    assert len(reply.prompts) > 2 and time.monotonic() - start[0] > 4, reply.prompts
    assert "no output from any rank" not in reply.text, reply.text
    assert "[rank0]:after 0" in reply.text and "[rank1]:after 1" in reply.text, reply.text


def test_no_front_end_breakpoint_and_input_fail_at_once(kernel):
    """papermill / nbclient (allow_stdin False): the immediate, clear errors of before."""
    reply = kernel.execute("%%ddp -n 2\nimport os, sys\nif os.environ['RANK'] == '1':\n    breakpoint()\n"
                           "    x = 1\nprint('stdin', repr(sys.stdin.readline()))", allow_stdin=False, timeout=60)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    text = "\n".join(reply.error["traceback"])
    assert "rank 1: failed (NoDebugger: breakpoint(): no front end can answer the debugger here" in text, text
    assert "[rank0]:stdin ''" in reply.text, reply.text   # sys.stdin is at its end, as /dev/null was
    assert reply.elapsed < 30, reply.elapsed
    assert not reply.prompts


def test_breakpoint_in_a_pool_cell_and_the_pool_stays_usable(kernel):
    kernel.ok("%ddp_pool start -n 2")
    try:
        reply = kernel.converse("%%ddp\nimport os\nrank = int(os.environ['RANK'])\ntotal = rank * 5\n"
                                "if rank == 1:\n    breakpoint()\n    total += 1",
                                scripted("p total", "n", "p total", "c"))
        assert reply.status == "ok", reply.text + str(reply.error)
        assert reply.prompts[:3] == ["(Pdb rank 1) "] * 3, reply.prompts
        assert "[rank1]:5\n" in reply.text and "[rank1]:6\n" in reply.text, reply.text
        again = kernel.ok("%%ddp\nprint('again', total)")
        assert "[rank0]:again 0" in again.text and "[rank1]:again 6" in again.text, again.text
    finally:
        kernel.ok("%ddp_pool stop")


def test_stop_button_at_the_prompt_ends_the_launch_as_an_interrupt(kernel):
    def answer(prompt, reply):
        kernel.km.interrupt_kernel()
        return None   # the user never answers: the stop button ends it

    reply = kernel.converse("%%ddp -n 2\nimport os\nif os.environ['RANK'] == '0':\n    breakpoint()\n"
                            "    x = 1\nimport time\ntime.sleep(60)", answer, timeout=60)
    assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply.text
    assert "interrupted: all ranks were stopped" in reply.error["evalue"] + reply.text, reply.error
    assert reply.elapsed < 30, reply.elapsed
    assert worker_pids(kernel) == []


def test_torchrun_ranks_say_the_debugger_needs_nbddps_own(kernel):
    reply = kernel.converse("%%ddp -n 1 --launcher torchrun\nbreakpoint()\nx = 1", lambda p, r: "c", timeout=180)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    text = "\n".join(reply.error["traceback"]) + reply.text
    assert "the debugger reaches the notebook from nbddp's own ranks only" in text, text
    assert not reply.prompts


def test_a_kernel_that_ran_ray_init_still_debugs_its_ranks(kernel):
    """``ray.init()`` in a notebook sets PYTHONBREAKPOINT to Ray's driver-only hook (its
    worker.py); ranks inheriting it failed at ``breakpoint()`` inside Ray. Set here as Ray sets it,
    without starting a Ray."""
    kernel.ok("import os\nos.environ['PYTHONBREAKPOINT'] = 'ray.util.rpdb._driver_set_trace'")
    try:
        reply = kernel.converse(BREAK_ON_RANK_1, scripted("p x", "c"), timeout=120)
        assert reply.status == "ok", reply.text + str(reply.error)
        assert reply.prompts[:1] == ["(Pdb rank 1) "], reply.prompts
        assert "[rank1]:10" in reply.text and "rank 1 done" in reply.text, reply.text
    finally:
        kernel.ok("del os.environ['PYTHONBREAKPOINT']")
