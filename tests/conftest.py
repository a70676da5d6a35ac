import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kernel import Kernel  # noqa: E402


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One real kernel per test module, with nbddp loaded."""
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")))
    k.ok("%load_ext nbddp")
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel(tmp_path):
    """A kernel of the test's own, for tests that interrupt or kill it."""
    k = Kernel(cwd=str(tmp_path))
    k.ok("%load_ext nbddp")
    yield k
    k.shutdown()
