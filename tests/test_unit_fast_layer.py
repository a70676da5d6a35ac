"""The fast layer stays fast: a test not marked ``kernel`` that starts a process fails at once
(tests/conftest.py), whether it starts one itself or through nbddp; a test that uses a kernel
fixture is marked by that use. The one allowance, ``starts_tool("ruff")``, starts ruff's own
executable and nothing else."""
import os
import shlex
import subprocess
import sys

import pytest
from ruff.__main__ import find_ruff_bin

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


@pytest.mark.starts_tool("ruff")
def test_a_test_allowed_ruff_may_start_ruff():
    assert subprocess.run([find_ruff_bin(), "--version"], capture_output=True).returncode == 0


@pytest.mark.starts_tool("ruff")
def test_the_ruff_allowance_starts_nothing_else(tmp_path, monkeypatch):
    ruff = find_ruff_bin()
    other = tmp_path / "ruff"  # another program of the same name
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    for argv, shell in (([sys.executable, "-c", "pass"], False), ([str(other), "--version"], False),
                        (f"{shlex.quote(ruff)} --version", True)):  # ruff, but through a shell
        with pytest.raises(RuntimeError, match="is not marked `kernel`"):
            subprocess.run(argv, shell=shell)
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        os.system(f"{shlex.quote(ruff)} --version")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        nbddp.run("pass", n=1, timeout=30)


@pytest.mark.starts_tool("no-such-tool")
def test_a_tool_name_not_in_the_table_allows_nothing():
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        subprocess.run([find_ruff_bin(), "--version"])


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
