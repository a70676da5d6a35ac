"""The kernel's descriptors, without a process (issue #37 point 8): one rank's plumbing that runs
out of descriptors half-way closes what it had opened; a launch that needs more than the soft
limit raises it toward the hard one. (A refused launch, in a real kernel: test_descriptors.py.)"""
import os
import resource

import pytest

from nbddp.forkserver import spares, starter
from nbddp.sources import descriptors


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def limit_with_room(room: int) -> int:
    """A soft limit under which about ``room`` more descriptors can be opened (a new one
    takes the lowest free number, so holes below the highest open one count)."""
    taken = set(map(int, os.listdir("/proc/self/fd")))
    limit, free = 0, 0
    while free < room:
        free += limit not in taken
        limit += 1
    return limit


@pytest.fixture
def soft_limit():
    """Sets this process's soft RLIMIT_NOFILE for the test; put back after."""
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield lambda soft: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, saved[1]))
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_plumbing_that_runs_out_half_way_leaks_nothing(soft_limit):
    ctx = starter.context("spawn")  # only its Pipe and an unstarted Process object: nothing runs
    before, failed = fds(), 0
    for room in range(1, 12):  # room for some of its 10 descriptors, or all of them
        soft_limit(limit_with_room(room))
        try:
            spares.Plumbing(ctx, duplex=True).discard()
        except OSError:
            failed += 1
        soft_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        assert fds() == before, f"{fds() - before} descriptors left with room for {room}"
    assert failed >= 5, failed


def test_a_launch_that_needs_more_raises_the_soft_limit_to_the_hard_one(soft_limit):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < fds() + 10 * descriptors.PER_RANK + descriptors.MARGIN:
        pytest.skip(f"a hard limit of {hard} is too low for this test")
    soft_limit(fds() + 20)
    descriptors.fit(10)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= fds() + 10 * descriptors.PER_RANK
