import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kernel import Kernel  # noqa: E402


def _loaded(k: Kernel) -> Kernel:
    """nbddp loaded, and its forkserver up: the first cell of a kernel waits for the forkserver
    to import torch and nbddp/forkserver/preload.py's list (seconds), which is no test's subject, so tests
    that bound a cell's time start after it."""
    k.ok("%load_ext nbddp")
    k.ok("%%ddp -n 1\npass", timeout=300)
    return k


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One real kernel per test module, with nbddp loaded."""
    k = _loaded(Kernel(cwd=str(tmp_path_factory.mktemp("nb"))))
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path):
    """A kernel of the test's own, for tests that interrupt or kill it."""
    k = _loaded(Kernel(cwd=str(tmp_path)))
    yield k
    k.shutdown()
