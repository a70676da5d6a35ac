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
