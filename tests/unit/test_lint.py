"""The code is linted and type-checked as pyproject.toml says ([tool.ruff], [tool.mypy];
docs/explanation/contributing.md says why each level): ruff over the package, the tests, the
benchmarks, the lessons' sources and the docs' Python, and mypy over nbddp (strict on
nbddp/core). A finding fails the fast layer with the tool's own report. mypy runs in this
process; ruff, a binary, is the one program a fast test may start (``starts_tool``,
tests/conftest.py)."""
import pathlib
import subprocess

import pytest
from mypy import api as mypy_api
from ruff.__main__ import find_ruff_bin

from support import ROOT

LINTED = ["nbddp", "tests", "benchmarks", "notebooks", "docs/_ext", "docs/conf.py"]


def _ruff(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([find_ruff_bin(), "check", "--no-fix", "--output-format", "concise", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.starts_tool("ruff")
def test_ruff_finds_nothing_in_the_code():
    done = _ruff(*LINTED)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.starts_tool("ruff")
def test_ruff_reads_the_projects_rules(tmp_path):
    """Not vacuous: the same call reports a finding in code that has one, by its code."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    done = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "F401" in done.stdout, done.stdout + done.stderr


def test_mypy_finds_nothing_in_nbddp(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's `files` and the cache are the checkout's
    out, err, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, out + err
