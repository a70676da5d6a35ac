"""The line commands ``%ddp_pool``, ``%ddp_diff`` and ``%ddp_export``: their lines parsed and checked (pure).

``%ddp_pool start|status|restart|stop`` against the pool there is; ``%ddp_export SCRIPT.py``
with the cell below or the last ``%%ddp`` cell's options. The ``%%ddp`` options they carry are
nbddp/core/launchrules.py's; a bad line is a ``DDPUsageError`` before anything starts.
"""
from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass

from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import check_pool_spec, check_script_name
from nbddp.core.optionvalues import diff_names, shown as _shown
from nbddp.core.spec import LaunchSpec

POOL_USAGE = ("usage: %ddp_pool start [--all-cells] [%%ddp launch options] | status | restart | stop | "
              "all-cells on|off")
POOL_COMMANDS = ("start", "status", "restart", "stop", "all-cells")
ALL_CELLS = "--all-cells"  # %ddp_pool's own option (not a %%ddp one): every cell runs on the pool


@dataclass(frozen=True)
class PoolCommand:
    """One ``%ddp_pool`` line, checked."""

    command: str                     # one of POOL_COMMANDS
    spec: LaunchSpec | None = None   # the new pool's (start; restart with options)
    help_only: bool = False          # -h printed the help: do nothing else
    all_cells: bool | None = None    # every cell on the pool from now (True), no more (False), as was (None)


def parse_pool_line(line: str, *, running: bool, exists: bool) -> PoolCommand:
    """``%ddp_pool start [options]`` · ``status`` · ``restart [options]`` · ``stop``, checked
    against the pool there is (``exists``: one was started; ``running``: it serves cells)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise DDPUsageError(f"%ddp_pool: cannot split the line: {exc}") from None
    if not words:
        raise DDPUsageError(f"%ddp_pool: {POOL_USAGE}")
    command = words[0]
    if command not in POOL_COMMANDS:
        raise DDPUsageError(f"%ddp_pool: unknown command {_shown(command)}; {POOL_USAGE}")
    if command == "all-cells":
        return _all_cells(words[1:], running)
    cut = words.index("--") if "--" in words else len(words)  # after --: the script's arguments
    all_cells = ALL_CELLS in words[1:cut]
    if all_cells and command != "start":
        raise DDPUsageError(f"%ddp_pool: {ALL_CELLS} goes with start (or: %ddp_pool all-cells on)")
    rest = shlex.join([w for w in words[1:cut] if w != ALL_CELLS] + words[cut:])
    if command in ("status", "stop"):
        if rest:
            raise DDPUsageError(f"%ddp_pool: {command} takes no options, got {_shown(rest)}")
        return PoolCommand(command)
    if command == "start" and running:
        raise DDPUsageError("%ddp_pool: a pool is already running; %ddp_pool stop it first, "
                            "or %ddp_pool restart")
    if command == "restart" and not exists:
        raise DDPUsageError("%ddp_pool: no pool to restart; %ddp_pool start -n N")
    if command == "restart" and not rest:
        return PoolCommand(command)  # the same pool again
    spec = parse_line(rest)
    if spec is None:
        return PoolCommand(command, help_only=True)
    check_pool_spec(spec)
    return PoolCommand(command, spec, all_cells=True if all_cells else None)


def _all_cells(words: list[str], running: bool) -> PoolCommand:
    """``%ddp_pool all-cells on|off``."""
    if len(words) != 1 or words[0] not in ("on", "off"):
        raise DDPUsageError(f"%ddp_pool: usage: %ddp_pool all-cells on|off, got {_shown(shlex.join(words))}")
    if words[0] == "on" and not running:
        raise DDPUsageError("%ddp_pool: no pool is running to take every cell; "
                            f"%ddp_pool start -n N {ALL_CELLS}")
    return PoolCommand("all-cells", all_cells=words[0] == "on")


# ---------------------------------------------------------------- %ddp_diff
DIFF_USAGE = "usage: %ddp_diff NAME [NAME ...]  (modules, optimizers, tensors, dicts/lists of them, rng)"


def parse_diff_line(line: str, *, running: bool) -> tuple[str, ...] | None:
    """``%ddp_diff model opt rng`` → the names to compare (None: -h, the usage was printed);
    no names, a word that is not a name, or no running pool is a DDPUsageError."""
    words = line.split()
    if words and words[0] in ("-h", "--help"):
        print(DIFF_USAGE)
        return None
    if not words:
        raise DDPUsageError(f"%ddp_diff: {DIFF_USAGE}")
    try:
        names = diff_names(" ".join(words))
    except argparse.ArgumentTypeError as exc:
        raise DDPUsageError(f"%ddp_diff: {exc}; {DIFF_USAGE}") from None
    if not running:
        raise DDPUsageError("%ddp_diff compares a running pool's ranks, and none is running: "
                            "%ddp_pool start -n N, or --diff NAME on a %%ddp cell")
    return names


# ---------------------------------------------------------------- %ddp_export
_SLURM_JOB_FLAGS = ("--slurm", "--partition", "--account", "--time", "--sbatch", "--ray")


def parse_export_line(line: str, last_line: str | None, with_cell: bool) -> tuple[str, str]:
    """``%ddp_export SCRIPT.py [options]`` → (script, the %%ddp options to export with). Without
    a cell of its own (``with_cell`` False) it exports the last ``%%ddp`` cell (``last_line``:
    its line, None before any): no options means that cell's, and options that only shape the
    Slurm or Ray job (``--slurm``, ``--partition``, …, ``--ray``) are added to that cell's."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise DDPUsageError(f"%ddp_export: cannot split the line: {exc}") from None
    if not words:
        raise DDPUsageError("%ddp_export: usage: %ddp_export SCRIPT.py [%%ddp options]")
    path, options = os.path.expanduser(words[0]), shlex.join(words[1:])
    check_script_name(path, "%ddp_export")
    if with_cell:
        return path, options
    if last_line is None:
        raise DDPUsageError("%ddp_export: no %%ddp cell has run yet; run one, or use "
                            "%%ddp_export SCRIPT.py [options] with the cell below")
    if not options or _only_slurm_job_options(words[1:]):
        try:
            last = shlex.split(last_line)
        except ValueError as exc:  # it ran, so it split; unless a caller gives another line
            raise DDPUsageError(f"%ddp_export: cannot split the last cell's line: {exc}") from None
        cut = last.index("--") if "--" in last else len(last)
        options = shlex.join(last[:cut] + words[1:] + last[cut:])
    return path, options


def _only_slurm_job_options(words: list[str]) -> bool:
    """True for options that only shape the exported Slurm job (not the cell's ranks)."""
    i = 0
    while i < len(words):
        flag = words[i].split("=", 1)[0]
        if flag not in _SLURM_JOB_FLAGS:
            return False
        i += 1 if (flag in ("--slurm", "--ray") or "=" in words[i]) else 2
    return bool(words)
