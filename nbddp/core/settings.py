"""Every user-facing ``NBDDP_*`` variable, in one table (name, default, meaning, when it is read)
and read by one parser, so a setting is spelled, defaulted and parsed in one place and the docs'
table (docs/reference/environment.md) is checked against this one (tests/unit/test_settings.py).

A value that does not parse reads as the default: a setting never stops a cell.
Variables nbddp sets for its own processes are not settings: they start with ``_NBDDP_``
(nbddp/rank/torchrun_rank.py, nbddp/rank/cellsource.py) and are listed apart (INTERNAL)."""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # "words" (one of choices), "switch" (on unless an off word), "count" or "number" (>= 0)
    default: str  # the value unset (or unparsable) reads as
    meaning: str  # what it does, for the docs' table
    shown_default: str = ""  # the default as the docs say it, where the raw one says little
    choices: tuple[str, ...] = ()


OFF_WORDS = ("0", "false", "no", "off")

OUTPUT = Setting(
    "NBDDP_OUTPUT", "words", "", "`widgets` or `text`: the view every cell gets, whatever the front "
    "end (see {doc}`/howto/frontends`); read at each cell", "unset (`--output auto`)", ("widgets", "text"))
SAME_LINES = Setting(
    "NBDDP_SAME_LINES", "words", "merge", "`apart`: a line several ranks print alike is shown once "
    "per rank, as `--same-lines apart`; a cell's `--same-lines` wins; read at each cell",
    "unset (merge)", ("merge", "apart"))
SPARES = Setting(
    "NBDDP_SPARES", "count", "8", "how many spare processes the forkserver forks after a fresh "
    "cell, to be the next cell's ranks (at most as many as the cell had ranks); `0` turns spares off")
PRELOAD = Setting(
    "NBDDP_PRELOAD", "switch", "1", "`0` (or `false`, `no`, `off`): the notebook's own modules are "
    "not offered to the forkserver after each cell (torch and the training stack still are); works "
    "from the next cell, needs spares")
PRIVATE_NET = Setting(
    "NBDDP_PRIVATE_NET", "words", "auto", "`1`: the kernel's ranks, spares and stores live in a "
    "private network namespace that no other process reaches; `0`: never. Read once, at "
    "`%load_ext nbddp`, and written back as `1` or `0` ({doc}`/howto/jupyterhub`)",
    "unset: on where `JUPYTERHUB_USER` is set, else off", ("0", "1"))
LOG_RANK_MB = Setting(
    "NBDDP_LOG_RANK_MB", "number", "100", "the most each rank's log file (`rank3.stdout`) keeps in "
    "the log folder; past it a log keeps its head, one line saying what was cut, and its last 64 KB "
    "(the output shown in the notebook is whole); read at each cell")
LOG_TOTAL_MB = Setting(
    "NBDDP_LOG_TOTAL_MB", "number", "1000", "the most a launch's logs together keep in the log "
    "folder, cut as `NBDDP_LOG_RANK_MB` says; read at each cell")

SETTINGS = (OUTPUT, SAME_LINES, SPARES, PRELOAD, PRIVATE_NET, LOG_RANK_MB, LOG_TOTAL_MB)

# Set by nbddp for the processes it starts, never read from the user: the --launcher
# torchrun/slurm ranks' status folder, the cell's label, the --legacy-launch flag, the cell's copy.
ELASTIC_DIR = "_NBDDP_ELASTIC_DIR"
ELASTIC_CELL_LABEL = "_NBDDP_ELASTIC_CELL_LABEL"  # how tracebacks name the cell ("Cell In[3]")
ELASTIC_LEGACY_FLAG = "_NBDDP_ELASTIC_LEGACY_FLAG"  # the flag torch.distributed.launch passed
ELASTIC_SOURCE = "_NBDDP_ELASTIC_SOURCE"  # nbddp's copy of the cell (nbddp/rank/cellsource.py)
ELASTIC_TB_THEME = "_NBDDP_ELASTIC_TB_THEME"  # the kernel's traceback colours (nbddp/rank/ipytraceback.py)
INTERNAL = (ELASTIC_DIR, ELASTIC_CELL_LABEL, ELASTIC_LEGACY_FLAG, ELASTIC_SOURCE, ELASTIC_TB_THEME)
INTERNAL_MEANING = ("internal (hence the leading `_`): what `--launcher torchrun`/`slurm` tell the "
                    "ranks it starts (where to leave their status files, how tracebacks name the "
                    "cell and their colours, the `--legacy-launch` flag, the copy of the cell to run); "
                    "not for you to set")


def read(setting: Setting, environ: Mapping[str, str] | None = None) -> str | float | bool:
    """``setting``'s value in ``environ`` (the process's environment by default): a word of its
    choices (else its default), a switch's truth, a whole ("count") or any finite number, at
    least 0 (else its default)."""
    raw = (os.environ if environ is None else environ).get(setting.name, "").strip().lower()
    if setting.kind == "switch":
        return (raw or setting.default) not in OFF_WORDS
    if setting.kind in ("count", "number"):
        convert = int if setting.kind == "count" else float
        try:
            value = convert(raw or setting.default)
        except ValueError:
            value = convert(setting.default)
        return max(0, value) if math.isfinite(value) else convert(setting.default)
    return raw if raw in setting.choices else setting.default


def list_table_rows() -> str:
    """The settings as rows of docs/reference/environment.md's MyST list-table (name, default,
    effect); tests/unit/test_settings.py holds the page to them."""
    rows = []
    for s in SETTINGS:
        default = s.shown_default or f"`{s.default}`"
        rows.append(f"* - `{s.name}`\n  - {default}\n  - {s.meaning}")
    internal = ", ".join(f"`{name}`" for name in INTERNAL)
    rows.append(f"* - {internal}\n  - set by nbddp\n  - {INTERNAL_MEANING}")
    return "\n".join(rows)
