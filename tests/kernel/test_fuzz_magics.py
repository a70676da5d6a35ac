"""A sample of the generated hostile lines (tests/unit/test_fuzz_input.py) through the real
magics in a real kernel: ``%%ddp``, ``%ddp_pool`` and ``%ddp_export`` each answer a line the
rules refuse with IPython's UsageError (one line, no traceback) and start no process; so does
a cell with a top-level ``return``, ``yield`` or ``await`` (which failed on every rank).

Only lines the pure rules refuse go to ``%%ddp`` and ``%ddp_pool start`` (a line they accept
would launch); all of them go through the magics in one cell, so the sample costs one kernel
and a few seconds."""
from __future__ import annotations

import json
import random

from nbddp import DDPUsageError
from nbddp.core import ddpline
from support.fuzz import SEED, random_line
from support.kernel import Kernel

SAMPLE = 150

PROBE = """
import json
from IPython.core.error import UsageError
seen = {}
for kind, line in json.loads(%r):
    try:
        if kind == "ddp":
            get_ipython().run_cell_magic("ddp", line, "print('ran')")
        elif kind == "cell":  # a cell every rank would refuse: top-level return, yield, await
            get_ipython().run_cell_magic("ddp", "-n 2", line)
        elif kind == "pool":
            get_ipython().run_line_magic("ddp_pool", "start " + line)
        else:
            get_ipython().run_cell_magic("ddp_export", "x.py " + line, "print('ran')")
        seen[kind + " " + line] = "accepted"
    except UsageError:
        seen[kind + " " + line] = "usage"
    except BaseException as exc:
        seen[kind + " " + line] = type(exc).__name__ + ": " + str(exc)[:200]
print("SEEN", json.dumps(seen))
"""


def _refused(line: str) -> bool:
    try:
        ddpline.parse_line(line)
    except DDPUsageError:
        return True
    return False


def _sendable(line: str) -> bool:
    """Through the kernel's JSON messages and onto one magic line."""
    try:
        line.encode("utf-8")
    except UnicodeError:
        return False
    return "\n" not in line and "\r" not in line and "-h" not in line.split() and "--help" not in line


def test_hostile_lines_through_the_real_magics_are_usage_errors_and_start_nothing(tmp_path):
    rng = random.Random(SEED + 10)
    lines: list[tuple[str, str]] = []
    while len(lines) < SAMPLE:
        line = random_line(rng)
        if _sendable(line) and _refused(line):
            lines.append((rng.choice(["ddp", "pool", "export"]), line))
    lines += [("cell", "print('ran')\nreturn 1"), ("cell", "yield 2"), ("cell", "await f()")]
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")
        before = {p.pid for p in k.descendants()}
        reply = k.ok(PROBE % json.dumps(lines), timeout=120)
        seen = json.loads(reply.stdout.split("SEEN ", 1)[1])
        after = {p.pid for p in k.descendants()}
    finally:
        k.shutdown()
    assert len(seen) == len(set(lines)), reply.stdout[-2000:]
    wrong = {line: what for line, what in seen.items() if what != "usage"}
    assert not wrong, wrong
    assert after <= before, "a process was started"
