"""The fast layer stays fast: a test in tests/unit/ is not marked ``kernel``, and one that starts a
process fails at once (tests/conftest.py), whether it starts one itself or through nbddp. The
folder gives the marker: tests/kernel/ and tests/browser/ are ``kernel`` (browser ``browser``
too), and a test in tests/unit/ marked ``kernel`` or using a kernel fixture, or a test file in
no layer's folder, is refused before any test runs. The one allowance, ``starts_tool("ruff")``,
starts ruff's own executable and nothing else. (A test in tests/kernel/ that may start a
process: tests/kernel/test_kernel_layer.py.)"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ruff.__main__ import find_ruff_bin

import conftest
import nbddp


def test_a_test_in_tests_unit_is_not_marked(request):
    assert Path(request.node.path).parent.name == "unit"
    assert request.node.get_closest_marker("kernel") is None


def test_an_unmarked_test_cannot_start_a_process():
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        subprocess.run([sys.executable, "-c", "pass"])


def test_an_unmarked_test_cannot_launch_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="is not marked `kernel`"):
        nbddp.run("pass", n=1, timeout=30)


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

    def __init__(self, folder, *fixtures, marked=False):
        self.path = conftest.TESTS / folder / "test_x.py"
        self.nodeid = f"tests/{folder}/test_x.py::test_x"
        self.fixturenames, self.marks = list(fixtures), ["kernel"] if marked else []

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.append(mark)


def test_the_folder_gives_the_markers():
    items = [Item("unit", "tmp_path"), Item("kernel", "tmp_path"), Item("kernel", "kernel"), Item("browser")]
    conftest.pytest_collection_modifyitems(items)
    assert [item.marks for item in items] == [[], ["kernel"], ["kernel"], ["kernel", "browser"]]


@pytest.mark.parametrize("item, words", [
    (Item("unit", marked=True), "is in tests/unit/: move it to tests/kernel/"),
    (Item("unit", "fresh_kernel"), "is in tests/unit/: move it to tests/kernel/"),
    (Item("support"), "is in no layer's folder"),
    (Item("."), "is in no layer's folder"),
], ids=["marked", "kernel-fixture", "support", "tests-itself"])
def test_a_test_that_starts_processes_in_unit_or_outside_the_layers_is_refused(item, words):
    with pytest.raises(pytest.UsageError, match=words):
        conftest.pytest_collection_modifyitems([item])


def test_the_longest_files_are_files_of_the_slow_layers():
    """scripts/test.sh sends the files conftest.LONGEST names first: each is a file in tests/kernel/
    or tests/browser/ (a renamed or moved one would silently start last)."""
    files = {path.name for folder in ("kernel", "browser") for path in (conftest.TESTS / folder).glob("test_*.py")}
    assert set(conftest.LONGEST) <= files, set(conftest.LONGEST) - files


def test_no_two_test_files_share_a_name():
    """The folders are not packages, so pytest imports each test file by its name alone: two
    files of one name in two layers stop the whole run at collection ("import file mismatch")."""
    tests = Path(conftest.__file__).parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
