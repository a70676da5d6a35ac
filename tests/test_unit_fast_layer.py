"""The fast layer stays fast: a test not marked ``kernel`` that starts a process fails at once
(tests/conftest.py), whether it starts one itself or through nbddp; a test that uses a kernel
fixture is marked by that use."""
import subprocess
import sys

import pytest

import conftest
import nbddp


def test_an_unmarked_test_cannot_start_a_process():
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        subprocess.run([sys.executable, "-c", "pass"])


def test_an_unmarked_test_cannot_launch_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        nbddp.run("pass", n=1, timeout=30)


@pytest.mark.kernel
def test_a_marked_test_may():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


class Item:
    """What conftest's collection hook reads of a test item and gives it."""

    def __init__(self, *fixtures):
        self.fixturenames, self.marks = list(fixtures), []

    def add_marker(self, mark):
        self.marks.append(mark.name)


def test_tests_using_a_kernel_fixture_are_marked():
    items = [Item("tmp_path"), Item("kernel", "tmp_path"), Item("fresh_kernel")]
    conftest.pytest_collection_modifyitems(items)
    assert [item.marks for item in items] == [[], ["kernel"], ["kernel"]]
