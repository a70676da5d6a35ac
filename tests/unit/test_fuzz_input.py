"""Random and hostile input through every way in (issue 37, "How"): a few thousand generated
``%%ddp`` / ``%ddp_pool`` / ``%ddp_export`` lines and ``nbddp.run`` keyword arguments, each
either accepted (a LaunchSpec every rule has passed, and a process source chosen for it) or
refused with DDPUsageError (the magic's UsageError: one line, before anything starts). Nothing
else may come out: no TypeError, UnicodeError, OverflowError, OSError, and no process started.

Seeded (``NBDDP_FUZZ_SEED`` picks another seed, ``NBDDP_FUZZ_CASES`` another count) and bounded
in time; a failure names the seed and the input, so it can be replayed. Pure: the parser and
the rules, as nbddp.run and the magics call them before anything starts."""
from __future__ import annotations

import math
import os
import random
import shlex
import time

import psutil
import pytest

from nbddp import DDPUsageError
from nbddp.core import ddpline, launchrules as rules, linecommands
from nbddp.core.spec import LaunchSpec
from support.fuzz import SEED, random_line

CASES = int(os.environ.get("NBDDP_FUZZ_CASES", "3000"))
BUDGET_S = 60.0  # each test's whole run; on 2 busy cores it takes a few seconds

API_VALUES = [
    None, True, False, 0, -1, 1, 2, 3, 2 ** 70, -(2 ** 70), 10 ** 400, 10 ** 5000, [10 ** 5000], 1.5, math.nan,
    math.inf, -math.inf, 1e-320, "", "x",
    "29500", "10", "\x00", "\ud800", "a" * 300, [], [1], ["a"], ["\x00"], (1, 2), (0, 99), {}, {"A": "1"},
    {"A": 1}, {"1": "x"}, {1: 2}, {"A": "\x00"}, {"A": "\udc80"}, [("A", "1")], [("A",)], object(), b"bytes",
    range(2), {1, 2}, "torchrun", "slurm", "local", "gloo", "text", "/etc/passwd", "~/x", "localhost",
    "localhost:29500", "x.py", "dash", "--qos=high", "30", "x@a", "a b", ("x@a",), ("a b",), ("x", "y@1"),
    ("--qos=high",), ("-N 1\n#SBATCH -x",), "underscore", "-x", "nope",
]
API_KEYS = sorted(rules._FIELDS) + ["nproc_per_node", "nnodes", "env", "n_", "", "world_size"]


def _r(value) -> str:
    """repr, also of an int past Python's 4300 digits (which has none)."""
    try:
        return repr(value)
    except ValueError:
        return f"<{type(value).__name__} of over 4300 digits>"


def _accepted_or_usage(what, call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except DDPUsageError as exc:
        text = str(exc)
        assert text.startswith(("%%ddp", "%ddp_pool", "%ddp_export", "nbddp.run")), (what, text)
        assert len(text.splitlines()[0]) < 600, (what, text[:200])
        return None
    except Exception as exc:  # what this test exists to catch
        pytest.fail(f"seed {SEED}: {what} raised {type(exc).__name__}: {exc}")


def _source_for(spec, what):
    if spec is not None:
        _accepted_or_usage(what, rules.choose_source, spec)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def starts_nothing():
    before = _children()
    t0 = time.monotonic()
    yield
    assert _children() <= before, "a process was started"
    assert time.monotonic() - t0 < BUDGET_S, "the fuzz ran past its time budget"


def test_random_ddp_lines_parse_or_are_refused_in_one_line(capsys):
    rng = random.Random(SEED)
    for _ in range(CASES):
        line = random_line(rng)
        what = f"%%ddp {line!r}"
        spec = _accepted_or_usage(what, ddpline.parse_line, line)
        _source_for(spec, what)
        shape = LaunchSpec(nproc_per_node=2)  # a running pool's
        _source_for(_accepted_or_usage(what, ddpline.parse_line, line, shape=shape), what)
    capsys.readouterr()  # -h printed the help


def test_random_pool_and_export_lines_parse_or_are_refused_in_one_line(capsys):
    rng = random.Random(SEED + 1)
    for _ in range(CASES // 2):
        line = random_line(rng)
        command = rng.choice(linecommands.POOL_COMMANDS + ("", "go", "start", "restart"))
        running, exists = rng.random() < 0.5, rng.random() < 0.5
        _accepted_or_usage(f"%ddp_pool {command} {line!r}", linecommands.parse_pool_line, f"{command} {line}",
                           running=running, exists=exists)
        script = rng.choice(["x.py", "", "x", "a b.py", "\x00.py", "\ud800.py", "--slurm", "-n"])
        last = rng.choice([None, "", random_line(rng), "-n 2 -- --lr 1", "-n 2 'unclosed"])
        line = rng.choice([line, "", "--slurm", "--partition p --time 5"])  # the last cell's options
        with_cell = rng.random() < 0.5
        what = f"%ddp_export {shlex.quote(script)} {line!r} (last cell's line {last!r})"
        got = _accepted_or_usage(what, linecommands.parse_export_line, f"{shlex.quote(script)} {line}", last, with_cell)
        if got is not None:
            _source_for(_accepted_or_usage(what, ddpline.parse_line, got[1]), what)
    capsys.readouterr()


def test_random_api_keyword_arguments_are_accepted_or_refused_in_one_line():
    rng = random.Random(SEED + 2)
    for _ in range(CASES):
        options = {rng.choice(API_KEYS): rng.choice(API_VALUES) for _ in range(rng.randrange(0, 5))}
        n = rng.choice([None, None, 1, 2, 0, -1, True, 2.0, "2", 99999999999, 2 ** 70, 10 ** 5000])
        what = f"nbddp.run(n={_r(n)}, **{_r(options)})"
        spec = _accepted_or_usage(what, rules.given_or_made, None, n, options)
        _source_for(spec, what)
        if spec is not None:  # the spec the API was given checks the same way again
            _accepted_or_usage(what, rules.given_or_made, spec)


def test_random_run_arguments_are_accepted_or_refused_in_one_line():
    """nbddp.run's own arguments (args, kwargs, cwd, env_base, push, cell_label), as it checks
    them before anything starts."""
    from nbddp import api

    rng = random.Random(SEED + 3)
    names = ("args", "kwargs", "cwd", "env_base", "push", "cell_label")
    for _ in range(CASES):
        given = dict(args=(), kwargs=None, cwd=None, env_base=None, push=None, cell_label=None)
        given.update({rng.choice(names): rng.choice(API_VALUES) for _ in range(rng.randrange(1, 3))})
        _accepted_or_usage(f"nbddp.run(..., **{_r(given)})", api._check_arguments, **given)


def test_export_script_names_that_cannot_be_files_are_refused():
    for name in ("x\x00.py", "\udc80.py", "\ud800.py"):
        with pytest.raises(DDPUsageError, match="not a file name"):
            linecommands.parse_export_line(shlex.quote(name) + " -n 2", None, with_cell=True)
        with pytest.raises(DDPUsageError, match=r"NUL|surrogate"):
            ddpline.parse_line(f"--export {shlex.quote(name)}")
