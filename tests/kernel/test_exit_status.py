"""A forkserver rank's exit code, read by several threads at once (each Process.start() polls
every earlier child: the rank starts in starter.start_all's threads, the spares' refill): one
read, the same true code for all; multiprocess alone gives some of them 255 (the status pipe
read empty by the second reader)."""
import json
import os
import subprocess
import sys
import threading
import time

from multiprocess.connection import wait

import nbddp.sources.rankprocs
from nbddp.core.exitstates import exit_status
from nbddp.forkserver import starter
from nbddp.rank.torchrun_rank import STATUS_DIR_VAR


def _exit_7():
    import os

    os._exit(7)


def _poll_together(barrier, process):
    barrier.wait()
    process._popen.poll()


def test_an_exit_code_polled_by_several_threads_at_once_is_the_true_one():
    ctx = starter.context("forkserver")
    codes = []
    for _ in range(30):
        process = ctx.Process(target=_exit_7)
        starter.start(process)
        # it has exited and its status waits in the pipe (a fixed sleep was too short on a busy machine)
        assert wait([process.sentinel], 30)
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=_poll_together, args=(barrier, process)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        codes.append(process.exitcode)
        process.close()
    assert codes == [7] * 30, codes


# ------------------------------------------------- the exit status a torchrun rank reports


CODES = ["-9", "256", "2**70", "True", "'a message'", "3"]


def test_a_torchrun_rank_reports_the_exit_status_its_process_ends_with(tmp_path):
    """``sys.exit(-9)`` ends a process with status 247 (no signal), ``sys.exit(256)`` with 0: a
    torchrun rank's status file (what the kernel reports) says the status the process really
    ended with, the one plain ``python`` gives the same code (issue 37, point 17)."""
    seen = {}
    for i, code in enumerate(CODES):
        cell = tmp_path / f"cell{i}.py"
        cell.write_text(f"import sys\nsys.exit({code})\n")
        status = tmp_path / f"status{i}"
        status.mkdir()
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", **{STATUS_DIR_VAR: str(status)})
        rank = subprocess.run([sys.executable, "-m", "nbddp.rank.torchrun_rank", str(cell)], env=env,
                              capture_output=True, timeout=60)
        plain = subprocess.run([sys.executable, str(cell)], capture_output=True, timeout=60)
        reported = json.loads((status / "rank0.json").read_text())["exitcode"]
        seen[code] = (plain.returncode, rank.returncode, reported, exit_status(eval(code)))
    assert all(len(set(v)) == 1 for v in seen.values()), seen
    assert seen["-9"][0] == 247 and seen["256"][0] == 0, seen


# --------------------------------------------------- the exit grace is not the idle warning (#37.12)


CHECKPOINT_AT_EXIT = """
import atexit, os, time
def final_checkpoint():
    time.sleep({seconds})
    open(os.path.join({folder!r}, "rank" + os.environ["RANK"]), "w").write("saved")
if os.environ["RANK"] == "1":
    atexit.register(final_checkpoint)
print("cell done")
"""


def test_a_short_idle_warning_does_not_cut_a_ranks_exit_short(tmp_path):
    """--idle-warning 1 while rank 1's atexit handler takes 3 s (a final checkpoint): the handler
    runs to its end and the rank is ok (the idle warning also set the kill-at-exit limit: the
    rank was SIGKILLed at 1 s, its checkpoint never written, and reported ok)."""
    result = nbddp.run(CHECKPOINT_AT_EXIT.format(seconds=3, folder=str(tmp_path)), n=2, idle_warning=1,
                       timeout=60, sinks=[], check=False)
    assert [r.state for r in result.ranks] == ["ok", "ok"], result.summary()
    assert (tmp_path / "rank1").read_text() == "saved", result.notes


def test_a_rank_killed_at_the_end_of_its_exit_grace_is_not_reported_ok(tmp_path):
    """--exit-grace 1 while rank 1's atexit handler would take 30 s: nbddp kills it after about
    1 s and reports it killed (with why), not ok; rank 0 stays ok."""
    t0 = time.monotonic()
    result = nbddp.run(CHECKPOINT_AT_EXIT.format(seconds=30, folder=str(tmp_path)), n=2, exit_grace=1,
                       timeout=60, sinks=[], check=False)
    assert time.monotonic() - t0 < 20
    assert [r.state for r in result.ranks] == ["ok", "killed"], result.summary()
    assert result.ranks[1].exitcode == -9 and "--exit-grace" in result.ranks[1].cause, result.ranks[1].cause
    assert not result.ok and not (tmp_path / "rank1").exists()
