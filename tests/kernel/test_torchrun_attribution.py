"""%%ddp --launcher torchrun names the rank that caused a failure as the local launcher does, for
real (a kernel, torch's own torchrun): a rank that kills itself is "killed", not "stopped by
torchrun", even where torchrun's summary calls the peer that lost it the root cause; that peer
failed with the one-line "another rank ended" hint and gloo's error without its build path;
and a launch that torchrun is ending gets no "a hung collective?" idle warning."""
import pytest

from support.kernel import Kernel

KILLED_IN_A_COLLECTIVE = """import os, signal, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
for i in range(100000):
    if i == 5 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)   # rank 1 dies; rank 0 loses its peer in all_reduce
    dist.all_reduce(t)
"""

STATES = "print([(r.rank, r.state, r.cause, r.hint, r.exitcode) for r in _ddp.ranks])"


@pytest.mark.parametrize("launcher", ["--launcher torchrun", ""])
def test_the_rank_that_died_is_the_cause_and_its_peer_lost_it(kernel: Kernel, launcher):
    """The same cell under both launchers: the same states, causes and hint."""
    reply = kernel.execute(f"%%ddp -n 2 --timeout 90 {launcher}\n" + KILLED_IN_A_COLLECTIVE, timeout=180)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    states = eval(kernel.ok(STATES).stdout)
    (_, state0, cause0, hint0, code0), (_, state1, cause1, hint1, code1) = states
    assert (state1, cause1, code1) == ("killed", "killed by SIGKILL (from outside nbddp, or out of memory)", -9), states
    # rank 0 raised in its all_reduce (gloo: closed / reset by peer); under torchrun its SIGTERM
    # may rarely come first, and then torchrun stopped it
    if state0 == "failed":
        assert "by peer" in cause0 and "at cell line 8" in cause0, states
        assert "/__w/" not in cause0 and "GLHF" not in cause0 and cause0.startswith("RuntimeError: [pair.cc:"), cause0
        assert hint0 and hint0.startswith("another rank ended"), states
    else:
        assert launcher and (state0, cause0) == ("terminated", "stopped by torchrun after another rank failed"), states
    traceback = "\n".join(reply.error["traceback"])
    assert "hung collective" not in traceback + reply.text, reply.text
    # the killed rank's end is when it was first seen gone, not when torchrun's summary came
    ended = eval(kernel.ok("print([r.ended_at for r in _ddp.ranks])").stdout)
    assert ended[1] < ended[0] + 1.0, ended


def test_no_idle_warning_while_torchrun_ends_the_launch(kernel: Kernel):
    """Rank 1 dies; rank 0 ignores torchrun's SIGTERM and takes 6 s to end by itself. Nothing is
    printed meanwhile, yet the launch is ending, not hung: no idle warning (2 s here), and no note
    that torchrun failed (rank 1's death says why)."""
    cell = """import os, signal, time, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # rank 0 takes its time to end
dist.barrier()
print("past the barrier", flush=True)    # output: an idle warning of the slow start is history
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(6)
"""
    reply = kernel.execute("%%ddp -n 2 --launcher torchrun --idle-warning 2 --timeout 90\n" + cell, timeout=180)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text
    notes = eval(kernel.ok("print(_ddp.notes)").stdout)
    # (a slow start may be warned about: its note names the imports, not the sleep)
    assert not any("no output from any rank" in n and "time.sleep" in n for n in notes), notes
    assert not notes or all(n.startswith("warning: no output") for n in notes), notes  # nothing else to say
    states = eval(kernel.ok(STATES).stdout)
    assert [s[1:3] for s in states] == [("ok", ""),
                                        ("killed", "killed by SIGKILL (from outside nbddp, or out of memory)")], states


def test_a_quiet_rank_still_gets_the_idle_warning_under_torchrun(kernel: Kernel):
    """The warning is kept where nothing ended: both ranks quiet in a collective."""
    cell = """import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    time.sleep(5)
dist.barrier()
dist.destroy_process_group()
"""
    kernel.ok("%%ddp -n 2 --launcher torchrun --idle-warning 2 --timeout 90\n" + cell, timeout=180)
    notes = kernel.ok("print(_ddp.notes)").stdout
    assert "no output from any rank for" in notes, notes
