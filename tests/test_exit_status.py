"""A forkserver rank's exit code, read by several threads at once (each Process.start() polls
every earlier child: the rank starts in starter.start_all's threads, the spares' refill): one
read, the same true code for all; multiprocess alone gives some of them 255 (the status pipe
read empty by the second reader)."""
import threading

from multiprocess.connection import wait

import pytest

import nbddp.sources.rankprocs  # noqa: F401 - what the launcher imports
from nbddp.forkserver import starter

pytestmark = pytest.mark.kernel  # see tests/conftest.py


def _exit_7():
    import os

    os._exit(7)


def test_an_exit_code_polled_by_several_threads_at_once_is_the_true_one():
    ctx = starter.context("forkserver")
    codes = []
    for _ in range(30):
        process = ctx.Process(target=_exit_7)
        starter.start(process)
        # it has exited and its status waits in the pipe (a fixed sleep was too short on a busy machine)
        assert wait([process.sentinel], 30)
        barrier = threading.Barrier(4)

        def poll():
            barrier.wait()
            process._popen.poll()

        threads = [threading.Thread(target=poll) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        codes.append(process.exitcode)
        process.close()
    assert codes == [7] * 30, codes


# ------------------------------------------------- the exit status a torchrun rank reports
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from nbddp.core.exitstates import exit_status  # noqa: E402

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
        env = dict(os.environ, NBDDP_ELASTIC_DIR=str(status), RANK="0", LOCAL_RANK="0")
        rank = subprocess.run([sys.executable, "-m", "nbddp.rank.torchrun_rank", str(cell)], env=env,
                              capture_output=True, timeout=60)
        plain = subprocess.run([sys.executable, str(cell)], capture_output=True, timeout=60)
        reported = json.loads((status / "rank0.json").read_text())["exitcode"]
        seen[code] = (plain.returncode, rank.returncode, reported, exit_status(eval(code)))
    assert all(len(set(v)) == 1 for v in seen.values()), seen
    assert seen["-9"][0] == 247 and seen["256"][0] == 0, seen
