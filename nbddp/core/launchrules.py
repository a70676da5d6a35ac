"""The ``%%ddp`` options → a checked LaunchSpec, and every rule on what a launch may ask for.

Pure logic: the line's parser (argparse), the Python API's keywords (make_spec, given_or_made),
each option's type and range, what fits a launcher or a running pool, which process source runs
a launch (choose_source), the cell's syntax. Each bad argument becomes a ``DDPUsageError``
(nbddp/core/errors.py) with a one-line reason, raised before anything starts.
"""
from __future__ import annotations

import argparse
import functools
import ipaddress
import math
import os
import re
import shlex
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, NoReturn, TypeGuard, TypeVar

from nbddp.core import capacity
from nbddp.core.envvars import LAUNCHER_OWNED
from nbddp.core.errors import DDPUsageError
from nbddp.core.spec import BACKENDS, LAUNCHERS, OUTPUTS, SAME_LINES, START_METHODS, LaunchSpec

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Parser(argparse.ArgumentParser):
    """argparse that reports problems as DDPUsageError instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:  # argparse API
        # "argument -n/--world-size/--np: -n must be…" reads better without the alias list
        message = re.sub(r"^argument [^:]+: (?=-|port|not a|[A-Za-z-]+ (must|takes))", "", message)
        if len(message) > 300:  # argparse repeats what it did not recognize: a hostile line can be long
            message = message[:297] + "..."
        raise DDPUsageError(f"%%ddp: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise DDPUsageError(f"%%ddp: {message.strip()}")
        raise _HelpShown()


class _HelpShown(Exception):
    """Raised after ``-h`` printed the help text: nothing should run."""


def _positive_int(name: str) -> Callable[[str], int]:
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {_shown(text)}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value
    return conv


def _nonneg_int(name: str) -> Callable[[str], int]:
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {_shown(text)}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be 0 or more, got {value}")
        return value
    return conv


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a number, got {_shown(text)}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {value}")
    return value


def _seconds(name: str) -> Callable[[str], float]:
    def conv(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {_shown(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {_shown(text)}")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{name} must be more than 0 seconds, got {text}")
        return value
    return conv


def _seconds_or_off(name: str) -> Callable[[str], float]:
    """Seconds, or 0 to turn the feature off (stored as None)."""
    def conv(text: str) -> float:
        if text.strip() in ("0", "0.0", "off", "none"):
            return 0.0
        return _seconds(name)(text)
    return conv


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _ENV_KEY.match(key):
        raise argparse.ArgumentTypeError(f"--env takes KEY=VALUE, got {_shown(text)}")
    return key, value


def _int_list(name: str) -> Callable[[str], tuple[int, ...]]:
    def conv(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(part) for part in text.split(",") if part.strip() != "")
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes numbers separated by commas, got {_shown(text)}") from None
        if not values or min(values) < 0:
            raise argparse.ArgumentTypeError(f"{name} takes numbers 0 or more separated by commas, got {_shown(text)}")
        return values
    return conv


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(@\d+)?$", name):
            raise argparse.ArgumentTypeError(f"not a Python name: {_shown(name)}")
    return names


_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}|unlimited|infinite)$", re.I)


def _slurm_time(text: str) -> str:
    if not _SLURM_TIME.match(text.strip()):
        raise argparse.ArgumentTypeError(f"--time takes Slurm's MINUTES, HH:MM:SS or D-HH:MM:SS, got {_shown(text)}")
    return text.strip()


def _slurm_name(flag: str) -> Callable[[str], str]:
    def conv(text: str) -> str:
        if not re.match(r"^[\w.,@+-]+$", text):
            raise argparse.ArgumentTypeError(f"{flag} takes a Slurm name, got {_shown(text)}")
        return text
    return conv


def _sbatch_line(text: str) -> str:
    line = re.sub(r"^#SBATCH\s+", "", text.strip())
    if not line.startswith("-") or "\n" in line:
        raise argparse.ArgumentTypeError(f"--sbatch takes one sbatch option such as '--qos=high', got {_shown(text)}")
    return line


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%ddp", add_help=True, allow_abbrev=False,
                description="Run the cell as a torchrun-style job of ranked worker processes. "
                            "Arguments after -- become the workers' sys.argv[1:].")
    p.add_argument("-n", "--world-size", "--np", dest="n", type=_positive_int("-n"), default=None,
                   help="total number of ranks (default: nproc-per-node x nnodes, 1 rank)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                   type=_positive_int("--nproc-per-node"), default=None, help="ranks per (simulated) node")
    p.add_argument("--nnodes", type=_positive_int("--nnodes"), default=1,
                   help="number of nodes; with the local launcher they are simulated on this machine")
    p.add_argument("--max-ranks", dest="max_ranks", type=_positive_int("--max-ranks"), default=None,
                   metavar="N", help="allow up to N ranks on this machine (with --launcher slurm: in the "
                                     "job) in place of the bound nbddp sets from its cores, memory and process "
                                     "and descriptor limits, so that a typo such as -n 4000 is refused before "
                                     "anything starts")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=_nonneg_int("--node-rank"), default=None,
                   help="this machine's node rank (torchrun launcher only)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="localhost",
                   help="address of the rendezvous host (node 0), default localhost")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=_port, default=None,
                   help="rendezvous port (default: a free port per launch)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="backend hint, read in a rank with nbddp.backend() (auto: nccl with CUDA, else gloo)")
    p.add_argument("--timeout", type=_seconds("--timeout"), default=None,
                   help="seconds before a still-running launch is stopped and its stacks shown")
    p.add_argument("--idle-warning", dest="idle_warning", type=_seconds_or_off("--idle-warning"),
                   default=30.0, help="warn when no rank printed anything for this many seconds (0: never)")
    p.add_argument("--exit-grace", dest="exit_grace", type=_seconds("--exit-grace"), default=300.0,
                   metavar="SECONDS", help="seconds a rank whose cell has finished may take to exit (atexit "
                                           "handlers, non-daemon threads such as a final checkpoint) before nbddp "
                                           "kills it and reports it killed (default 300)")
    p.add_argument("--env", action="append", type=_env_pair, default=[], metavar="KEY=VALUE",
                   help="extra environment variable for every rank (repeatable)")
    p.add_argument("--legacy-launch", dest="legacy_launch", nargs="?", const="dash",
                   choices=("dash", "underscore"), default=None,
                   help="pass --local-rank=N (or --local_rank=N) in argv, as torch.distributed.launch did")
    p.add_argument("--start-method", dest="start_method", choices=START_METHODS, default="forkserver",
                   help="forkserver with torch preloaded (fast, default) or spawn (a fresh interpreter per rank)")
    p.add_argument("--ranks", dest="ranks_shown", type=_int_list("--ranks"), default=None,
                   help="show only these ranks' output, e.g. 0 or 0,2 (all ranks still run)")
    p.add_argument("--output", choices=OUTPUTS, default="auto",
                   help="auto: live widgets where a widget front end is connected, else text")
    p.add_argument("--same-lines", dest="same_lines", choices=SAME_LINES, default=None,
                   help="merge (default): a line several ranks print is shown once, as [ranks 0–3]:; apart: per rank")
    p.add_argument("--log-dir", dest="log_dir", default=None, help="where full per-rank logs are kept")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local (fast workers on this machine) or torchrun (torch.distributed.run)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=None,
                   help="HOST:PORT every node meets at (torchrun launcher, c10d rendezvous)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="c10d",
                   help="torchrun's rendezvous backend (default c10d)")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default=None,
                   help="job id shared by all nodes of one job (torchrun launcher)")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts",
                   type=_nonneg_int("--max-restarts"), default=0,
                   help="times torchrun restarts the ranks after a failure (torchrun launcher)")
    p.add_argument("--rdzv-timeout", "--rdzv_timeout", dest="rdzv_timeout", type=_seconds("--rdzv-timeout"),
                   default=None, help="seconds to wait for every node to join (torchrun's rdzv join_timeout)")
    p.add_argument("--gpus", type=_int_list("--gpus"), default=None, help="CUDA devices to use, e.g. 0,1,3")
    p.add_argument("--fresh", action="store_true", help="run a fresh job even while a pool runs")
    p.add_argument("--push", type=_names, default=(), help="notebook names to send into every worker")
    p.add_argument("--pull", type=_names, default=(), help="worker names to gather back (name or name@rank)")
    p.add_argument("--pdb", action="store_true",
                   help="the first rank to fail opens the debugger at the failing frame (as %%pdb)")
    p.add_argument("--export", default=None, metavar="SCRIPT.py", help="also write the cell as a torchrun script")
    p.add_argument("--slurm", action="store_true",
                   help="with --export / %%ddp_export: also write SCRIPT.sbatch, a Slurm batch job")
    p.add_argument("--partition", type=_slurm_name("--partition"), default=None, help="Slurm partition")
    p.add_argument("--account", type=_slurm_name("--account"), default=None, help="Slurm account")
    p.add_argument("--time", dest="time_limit", type=_slurm_time, default=None,
                   help="Slurm time limit of the job, e.g. 30 or 01:00:00")
    p.add_argument("--sbatch", action="append", type=_sbatch_line, default=[], metavar="OPTION",
                   help="extra #SBATCH line for the exported job, e.g. --sbatch '--qos=high' (repeatable)")
    return p


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """Built once: declaring the options costs more than parsing a line (which keeps no state in it)."""
    return build_parser()


def parse_line(line: str, shape: LaunchSpec | None = None) -> LaunchSpec | None:
    """Parse the ``%%ddp`` line; returns None when only help was asked for. ``shape`` (a running
    pool's spec) gives the number of ranks and nodes when the line names none."""
    try:
        words = shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise DDPUsageError(f"%%ddp: cannot split the line: {exc}") from None
    script_args: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    words = _glue_sbatch(words)
    parser = _parser()
    try:
        ns = parser.parse_args(words)
    except _HelpShown:  # argparse's -h already printed the help
        return None
    if shape is not None and ns.n is None and ns.nproc_per_node is None and ns.nnodes == 1:
        ns.nproc_per_node, ns.nnodes = shape.nproc_per_node, shape.nnodes  # the pool's shape
    if shape is not None and ns.max_ranks is None:
        ns.max_ranks = shape.max_ranks  # a pool started past the machine's bound runs its cells
    return make_spec(n=ns.n, nproc_per_node=ns.nproc_per_node, nnodes=ns.nnodes, node_rank=ns.node_rank,
                     master_addr=ns.master_addr, master_port=ns.master_port, backend=ns.backend,
                     timeout=ns.timeout, idle_warning=ns.idle_warning, exit_grace=ns.exit_grace, env=dict(ns.env),
                     legacy_launch=ns.legacy_launch, start_method=ns.start_method,
                     ranks_shown=ns.ranks_shown, output=ns.output, same_lines=ns.same_lines, log_dir=ns.log_dir,
                     script_args=script_args, launcher=ns.launcher, rdzv_endpoint=ns.rdzv_endpoint,
                     rdzv_backend=ns.rdzv_backend, rdzv_id=ns.rdzv_id, max_restarts=ns.max_restarts,
                     rdzv_timeout=ns.rdzv_timeout,
                     gpus=ns.gpus, fresh=ns.fresh, push=ns.push, pull=ns.pull, export=ns.export,
                     slurm=ns.slurm, partition=ns.partition, account=ns.account, time_limit=ns.time_limit,
                     sbatch=ns.sbatch, pdb=ns.pdb, max_ranks=ns.max_ranks)


def _glue_sbatch(words: list[str]) -> list[str]:
    """``--sbatch --qos=high`` → ``--sbatch=--qos=high`` (argparse would read --qos as an option)."""
    out: list[str] = []
    for word in words:
        if out and out[-1] == "--sbatch":
            out[-1] = f"--sbatch={word}"
        else:
            out.append(word)
    return out


def make_spec(n: int | None = None, nproc_per_node: int | None = None, nnodes: int = 1,
              **options: Any) -> LaunchSpec:
    """Build a LaunchSpec from keyword options (the Python API's entry), checking them all."""
    nnodes = 1 if nnodes is None else nnodes
    for name, value in (("-n", n), ("--nproc-per-node", nproc_per_node), ("--nnodes", nnodes)):
        if value is not None and (not _is_int(value) or value < 1 or _huge(value)):
            raise DDPUsageError(f"%%ddp: {name} must be a whole number of at least 1, got {_shown(value)}")
    if nproc_per_node is None:
        total = 1 * nnodes if n is None else n
        if total % nnodes:
            raise DDPUsageError(f"%%ddp: -n {total} ranks cannot be split evenly over --nnodes {nnodes}")
        nproc_per_node = total // nnodes
    elif n is not None and n != nproc_per_node * nnodes:
        raise DDPUsageError(f"%%ddp: -n {n} disagrees with --nproc-per-node {nproc_per_node} x "
                         f"--nnodes {nnodes} = {nproc_per_node * nnodes}")
    env = _env_pairs(options.pop("env", None))
    for key, _value in env:
        if not _ENV_KEY.match(str(key)):
            raise DDPUsageError(f"%%ddp: --env key {_shown(key)} is not a valid variable name")
    spec = LaunchSpec(nproc_per_node=nproc_per_node, nnodes=nnodes,
                      env=tuple((str(k), str(v)) for k, v in env))
    unknown = sorted(map(str, set(options) - _FIELDS))
    if unknown:
        raise DDPUsageError(f"%%ddp: unknown option{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(_shown, unknown))} (the options are %%ddp's, with underscores)")
    options = {k: v for k, v in options.items() if v is not None or k in ("timeout", "idle_warning")}
    for key in ("script_args", "push", "pull", "sbatch", "ranks_shown", "gpus"):
        if options.get(key) is not None:
            if not isinstance(options[key], (list, tuple, range)):
                raise DDPUsageError(f"%%ddp: {_flag(key)} takes a list, got {_shown(options[key])}")
            options[key] = tuple(options[key])
    if isinstance(options.get("log_dir"), os.PathLike):
        options["log_dir"] = os.fspath(options["log_dir"])
    spec = replace(spec, **options)
    _check(spec)
    return _expanded(spec)


def _env_pairs(env: object) -> tuple[tuple[Any, ...], ...]:
    """``env=`` as (key, value) pairs: a dict, or pairs (the parser's)."""
    if env is None:
        return ()
    if isinstance(env, dict):
        return tuple(env.items())
    if isinstance(env, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in env):
        return tuple(tuple(p) for p in env)
    raise DDPUsageError(f"%%ddp: env takes a dict of variables, got {_shown(env)}")


def _expanded(spec: LaunchSpec) -> LaunchSpec:
    """``--log-dir ~/logs`` (``--export ~/job.py``) is in the home folder, as a shell would
    expand it: a folder named ``~`` in the working folder is never what was meant."""
    for name in ("log_dir", "export"):
        path = getattr(spec, name)
        if path and path.startswith("~"):
            spec = replace(spec, **{name: os.path.expanduser(path)})
    return spec


_FIELDS = frozenset(LaunchSpec.__dataclass_fields__) - {"nproc_per_node", "nnodes", "env"}


def given_or_made(spec: LaunchSpec | None, n: int | None = None, options: dict[str, Any] | None = None,
                  shape: LaunchSpec | None = None) -> LaunchSpec:
    """The Python API's spec: the one the caller gave (checked again: a LaunchSpec can be built by
    hand), or one made from keyword options; both at once is refused. ``shape`` (a running pool's
    spec) gives the number of ranks and nodes when the options name none."""
    options = dict(options or {})
    if spec is not None:
        if n is not None or options:
            raise DDPUsageError(f"%%ddp: give spec= or options, not both (got spec= and "
                                f"{', '.join(['n'] * (n is not None) + sorted(options))})")
        if not isinstance(spec, LaunchSpec):
            raise DDPUsageError(f"%%ddp: spec= takes a LaunchSpec, got {_shown(spec)}")
        _check(spec)
        return _expanded(spec)
    if shape is not None and n is None and not {"nproc_per_node", "nnodes"} & set(options):
        options.update(nproc_per_node=shape.nproc_per_node, nnodes=shape.nnodes)
    if shape is not None and options.get("max_ranks") is None and shape.max_ranks is not None:
        options["max_ranks"] = shape.max_ranks
    return make_spec(n=n, **options)


# ------------------------------------------------------------- each option's type
def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A value in a message: its repr, cut (a hostile value can be a megabyte, and an int of
    more than 4300 digits has no repr at all)."""
    if _is_int(value) and _huge(value):
        return f"a {value.bit_length()}-bit number"
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


HUGE = 1 << 63  # no count, port or number of seconds nbddp takes is this large


def _huge(value: int) -> bool:
    return not -HUGE < value < HUGE


_FLAGS = {"ranks_shown": "--ranks", "time_limit": "--time"}


def _flag(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _ints(value: object) -> bool:
    return isinstance(value, tuple) and all(_is_int(v) for v in value)


def _texts(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


_INT, _OPT_INT = (_is_int, "a whole number"), (lambda v: v is None or _is_int(v), "a whole number")
_STR, _OPT_STR = (lambda v: isinstance(v, str), "text"), (lambda v: v is None or isinstance(v, str), "text")
_OPT_SECONDS = (lambda v: v is None or _is_seconds(v), "a number of seconds")
_BOOL = (lambda v: isinstance(v, bool), "True or False")
# what each LaunchSpec field takes, as the Python API may be given anything
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "nproc_per_node": _INT, "nnodes": _INT, "node_rank": _OPT_INT, "master_addr": _STR,
    "master_port": (lambda v: v is None or _is_int(v), "a port number (an int)"), "backend": _STR,
    "timeout": _OPT_SECONDS, "idle_warning": _OPT_SECONDS,
    "env": (lambda v: isinstance(v, tuple) and all(_texts(p) and len(p) == 2 for p in v), "KEY=VALUE pairs"),
    "legacy_launch": _OPT_STR, "start_method": _STR,
    "ranks_shown": (lambda v: v is None or _ints(v), "rank numbers"), "output": _STR, "same_lines": _OPT_STR,
    "log_dir": _OPT_STR, "script_args": (_texts, "a list of text arguments"), "launcher": _STR,
    "fresh": _BOOL, "push": (_texts, "names"), "pull": (_texts, "names"), "rdzv_endpoint": _OPT_STR,
    "rdzv_backend": _STR, "rdzv_id": _OPT_STR, "max_restarts": _INT, "rdzv_timeout": _OPT_SECONDS,
    "gpus": (lambda v: v is None or _ints(v), "device numbers"), "export": _OPT_STR, "slurm": _BOOL,
    "partition": _OPT_STR, "account": _OPT_STR, "time_limit": _OPT_STR,
    "sbatch": (_texts, "#SBATCH options"), "pdb": _BOOL, "max_ranks": _OPT_INT,
    "exit_grace": (_is_seconds, "a number of seconds"),
}
assert set(_TYPES) == set(LaunchSpec.__dataclass_fields__)
MAX_SECONDS = 365 * 24 * 3600.0  # any longer is a typo (and past what some waits accept)


def _check_types(spec: LaunchSpec) -> None:
    """Each field of the type it must have, its text passable to a process (argv, environment,
    a path: no NUL, no lone surrogate) and its numbers finite and in range."""
    for name, (ok, takes) in _TYPES.items():
        value = getattr(spec, name)
        if not ok(value):
            raise DDPUsageError(f"%%ddp: {_flag(name)} takes {takes}, got {_shown(value)}")
        if any(_huge(v) for v in _ints_in(value)):
            raise DDPUsageError(f"%%ddp: {_flag(name)} takes a number below 2**63, got {_shown(value)}")
        for text in _strings(value):
            if "\0" in text:
                raise DDPUsageError(f"%%ddp: {_flag(name)} cannot hold a NUL character, got {_shown(text)}")
            try:
                text.encode("utf-8")
            except UnicodeError:
                raise DDPUsageError(f"%%ddp: {_flag(name)} is not valid text (a lone surrogate), "
                                    f"got {_shown(text)}") from None
    for name in ("timeout", "idle_warning", "rdzv_timeout", "exit_grace"):
        value = getattr(spec, name)
        if value is None:
            continue
        least = 0 if name == "idle_warning" else None  # --idle-warning 0 turns it off
        if isinstance(value, float) and not math.isfinite(value):
            raise DDPUsageError(f"%%ddp: {_flag(name)} takes a number of seconds, got {value}")
        if not (value >= 0 if least == 0 else value > 0):
            more = "0 seconds or more" if least == 0 else "more than 0 seconds"
            raise DDPUsageError(f"%%ddp: {_flag(name)} must be {more}, got {value}")
        if value > MAX_SECONDS:
            raise DDPUsageError(f"%%ddp: {_flag(name)} {_shown(value)} seconds is more than a year")
    for name in ("node_rank", "max_restarts"):
        if getattr(spec, name) is not None and getattr(spec, name) < 0:
            raise DDPUsageError(f"%%ddp: {_flag(name)} must be 0 or more, got {getattr(spec, name)}")
    if spec.max_ranks is not None and spec.max_ranks < 1:
        raise DDPUsageError(f"%%ddp: --max-ranks must be at least 1, got {spec.max_ranks}")
    for name, check in (("partition", _slurm_name("--partition")), ("account", _slurm_name("--account")),
                        ("time_limit", _slurm_time)):
        if getattr(spec, name) is not None:
            _as_usage(check, getattr(spec, name))
    for line in spec.sbatch:
        _as_usage(_sbatch_line, line)
    for name in ("push", "pull"):
        for item in getattr(spec, name):
            if _as_usage(_names, item) != (item,):
                raise DDPUsageError(f"%%ddp: --{name} takes one name per item, got {_shown(item)}")
    if spec.legacy_launch not in (None, "dash", "underscore"):
        raise DDPUsageError(f"%%ddp: --legacy-launch must be dash or underscore, got {_shown(spec.legacy_launch)}")


def _ints_in(value: object) -> Iterator[int]:
    if _is_int(value):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _ints_in(item)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _strings(item)


_T = TypeVar("_T")


def _as_usage(conv: Callable[[str], _T], text: str) -> _T:
    """One of the parser's converters, for a value the Python API was given."""
    try:
        return conv(text)
    except argparse.ArgumentTypeError as exc:
        raise DDPUsageError(f"%%ddp: {exc}") from None


def check_host(host: str, who: str) -> None:
    """A host name or IP address a socket can be given: a name's labels 1–63 characters, 253 in
    all (IDNA; Python's resolver raises UnicodeError otherwise), no spaces or control characters."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return
    except ValueError:
        pass
    try:
        ascii_name = bare.rstrip(".").encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    if not ascii_name or len(ascii_name) > 253 or not re.match(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$", ascii_name):
        raise DDPUsageError(f"{who} takes a host name or IP address, got {_shown(host)} (a name is "
                            "dot-separated labels of 1–63 letters, digits or hyphens)")


def check_log_dir(path: str) -> None:
    """``--log-dir``: a folder that is there and writable, or one that can be made in the nearest
    folder that is (checked before anything starts, not an OSError half-way)."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.lexists(full) and not os.path.isdir(full):
        raise DDPUsageError(f"%%ddp: --log-dir {path}: exists and is not a folder")
    parent = full
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise DDPUsageError(f"%%ddp: --log-dir {path}: {parent} is not a folder, so no folder can be made in it")
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "is not writable" if parent == full else f"cannot be made: {parent} is not writable"
        raise DDPUsageError(f"%%ddp: --log-dir {path} {what} by this user")


def _check_capacity(spec: LaunchSpec) -> None:
    """No more ranks than the machine runs (nbddp/core/capacity.py), unless --max-ranks says so:
    the local launcher runs every rank here, torchrun this node's, Slurm none."""
    if spec.launcher == "slurm":
        here, machine = spec.world_size, None
    else:
        here = spec.world_size if spec.launcher == "local" else spec.nproc_per_node
        machine = capacity.machine()
    why = capacity.refusal(here, spec.world_size, spec.max_ranks, machine)
    if why:
        raise DDPUsageError(f"%%ddp: {why}")


def _check(spec: LaunchSpec) -> None:
    _check_types(spec)
    _check_capacity(spec)
    if spec.backend not in BACKENDS:
        raise DDPUsageError(f"%%ddp: --backend must be one of {', '.join(BACKENDS)}, got {_shown(spec.backend)}")
    if spec.start_method not in START_METHODS:
        raise DDPUsageError(f"%%ddp: --start-method must be one of {', '.join(START_METHODS)}")
    if spec.output not in OUTPUTS:
        raise DDPUsageError(f"%%ddp: --output must be one of {', '.join(OUTPUTS)}, got {_shown(spec.output)}")
    if spec.same_lines is not None and spec.same_lines not in SAME_LINES:
        raise DDPUsageError(f"%%ddp: --same-lines must be one of {', '.join(SAME_LINES)}, "
                            f"got {_shown(spec.same_lines)}")
    if spec.launcher not in LAUNCHERS:
        raise DDPUsageError(f"%%ddp: --launcher must be one of {', '.join(LAUNCHERS)}, got {_shown(spec.launcher)}")
    if spec.master_port is not None and not 1 <= int(spec.master_port) <= 65535:
        raise DDPUsageError(f"%%ddp: port must be between 1 and 65535, got {spec.master_port}")
    if spec.timeout is not None and not spec.timeout > 0:
        raise DDPUsageError(f"%%ddp: --timeout must be more than 0 seconds, got {spec.timeout}")
    if spec.ranks_shown is not None:
        bad = [r for r in spec.ranks_shown if not 0 <= r < spec.world_size]
        if bad:
            raise DDPUsageError(f"%%ddp: --ranks {','.join(map(str, bad))} outside 0..{spec.world_size - 1}")
    if spec.node_rank is not None:
        if spec.launcher != "torchrun":
            raise DDPUsageError("%%ddp: --node-rank runs one node of a real multi-node job: "
                             "use it with --launcher torchrun (the local launcher simulates all nodes)")
        if spec.node_rank >= spec.nnodes:
            raise DDPUsageError(f"%%ddp: --node-rank {spec.node_rank} must be below --nnodes {spec.nnodes}")
    if not spec.master_addr:
        raise DDPUsageError("%%ddp: --master-addr must not be empty")
    check_host(spec.master_addr, "%%ddp: --master-addr")
    if spec.log_dir is not None:
        check_log_dir(spec.log_dir)
    for key, _ in spec.env:
        if key in LAUNCHER_OWNED:
            raise DDPUsageError(f"%%ddp: --env {key}=…: the launcher sets {key} for each rank, as torchrun "
                             f"does; {LAUNCHER_OWNED[key]}")
    if spec.launcher != "torchrun":
        for name, value in (("--rdzv-endpoint", spec.rdzv_endpoint), ("--rdzv-id", spec.rdzv_id),
                            ("--rdzv-timeout", spec.rdzv_timeout)):
            if value is not None:
                raise DDPUsageError(f"%%ddp: {name} is for a real multi-node job: use it with --launcher torchrun")
    if spec.launcher != "slurm" and not spec.slurm:
        slurm_options: tuple[tuple[str, object], ...] = (
            ("--partition", spec.partition), ("--account", spec.account), ("--time", spec.time_limit),
            ("--sbatch", spec.sbatch or None))
        for name, given in slurm_options:
            if given is not None:
                raise DDPUsageError(f"%%ddp: {name} is a Slurm option: use it with --launcher slurm, "
                                 "or with --export SCRIPT.py --slurm")
    if spec.launcher == "slurm" and spec.sbatch and not spec.slurm:
        raise DDPUsageError("%%ddp: --sbatch lines are for the exported job (--export SCRIPT.py --slurm); "
                         "a --launcher slurm cell takes --partition, --account and --time")
    if spec.launcher == "torchrun" and spec.nnodes > 1 and not spec.rdzv_endpoint:
        if spec.master_port is None:
            raise DDPUsageError(f"%%ddp: --nnodes {spec.nnodes} with --launcher torchrun needs a meeting point "
                                "every node can reach: --rdzv-endpoint HOST:PORT (c10d), or "
                                "--master-addr HOST --master-port PORT with --node-rank")
        if spec.node_rank is None:
            raise DDPUsageError("%%ddp: with --master-addr/--master-port (static rendezvous) each node needs "
                                f"its --node-rank (0..{spec.nnodes - 1}); or use --rdzv-endpoint HOST:PORT")
    if spec.launcher != "local" and (spec.push or spec.pull):
        raise DDPUsageError(_NO_VALUES_ACROSS.format(launcher=spec.launcher))
    if spec.launcher != "local" and spec.pdb:
        raise DDPUsageError(f"%%ddp: --pdb debugs nbddp's own ranks, which the notebook's input box "
                            f"reaches; --launcher {spec.launcher}'s ranks have no way back to it")
    for item in spec.pull:
        name, _, rank = item.partition("@")
        if rank and (len(rank) > 18 or not int(rank) < spec.world_size):
            shown = f"{item}: rank {rank}" if len(rank) <= 18 else f"{_shown(item)}: a rank"
            raise DDPUsageError(f"%%ddp: --pull {shown} outside 0..{spec.world_size - 1}")
    if spec.export is not None:
        check_script_name(spec.export, "%%ddp: --export")
    if spec.rdzv_endpoint is not None:
        match = re.match(r"^(\[[^\s\[\]]+\]|[^\s\[\]:]+|[^\s\[\]]+)(:\d{1,5})?$", spec.rdzv_endpoint)
        if not match:
            raise DDPUsageError(f"%%ddp: --rdzv-endpoint takes HOST[:PORT], got {_shown(spec.rdzv_endpoint)}")
        check_host(match.group(1), "%%ddp: --rdzv-endpoint")


_NO_VALUES_ACROSS = ("%%ddp: --push/--pull move values between the notebook and the local launcher's "
                     "ranks; with --launcher {launcher}, save and load files instead")


def check_script_name(path: str, who: str) -> None:
    if not isinstance(path, str) or not path or not path.endswith(".py"):
        raise DDPUsageError(f"{who}: the script name must end in .py, got {_shown(path)}")
    if "\0" in path or not _encodable(path):
        raise DDPUsageError(f"{who}: the script name is not a file name (a NUL or a lone surrogate), "
                            f"got {_shown(path)}")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def check_cell(source: str, who: str = "%%ddp", so: str = "so no rank was started") -> None:
    """The cell's syntax, checked here only, once, before any rank starts: a SyntaxError becomes
    a DDPUsageError that IPython shows as just the message (no frames from inside nbddp or
    IPython) and that still fails the cell for papermill. Line numbers are the notebook
    cell's (the magic's own line is line 1 of ``source``)."""
    try:  # compiled, not just parsed: a top-level return, yield or await is refused here too
        with warnings.catch_warnings():  # a SyntaxWarning ("is" with a literal) is each rank's to show
            warnings.simplefilter("ignore")
            compile(source, "<%%ddp cell>", "exec", dont_inherit=True)
    except ValueError as exc:  # a NUL in the source
        raise DDPUsageError(f"{who}: the cell cannot be compiled, {so}: {exc}") from None
    except SyntaxError as exc:
        where = f"cell line {exc.lineno}" if exc.lineno else "the cell"
        text = [f"{who}: {where} has a syntax error, {so}:"]
        if exc.text:
            code = exc.text.rstrip("\n")
            text.append("    " + code.strip())
            if exc.offset:
                indent = len(code) - len(code.lstrip())
                text.append("    " + " " * max(0, exc.offset - 1 - indent) + "^")
        text.append(f"SyntaxError: {exc.msg}")
        raise DDPUsageError("\n".join(text)) from None


# ------------------------------------------------------------ which source runs a launch
def choose_source(spec: LaunchSpec, *, pool: LaunchSpec | None = None, pool_ready: bool = True,
                  why_broken: str = "", func: bool = False, push: bool = False, args: bool = False,
                  own_env: bool = False) -> str:
    """Which process source runs a launch of ``spec`` (a name in nbddp/api.py's SOURCES: "local",
    "pool", "torchrun" or "slurm"), after the rules that tie
    a launch to its source. ``pool``: a started pool's spec (None: no pool), ready or not (and why
    it broke); ``func``: the target is a callable, not source text; ``push``: values to send;
    ``args``: args/kwargs for the target; ``own_env``: cwd or env_base given."""
    if spec.slurm and not spec.export:
        raise DDPUsageError("%%ddp: --slurm writes a Slurm job next to the exported script: "
                            "use it with --export SCRIPT.py (or %ddp_export SCRIPT.py --slurm)")
    if func and spec.export:
        raise DDPUsageError("%%ddp: --export writes the cell's source as a script: give source text, "
                            "not a callable")
    if args and not func:
        raise DDPUsageError("%%ddp: args and kwargs are for a callable; a cell's source text takes "
                            "script arguments (script_args=[...], or after -- on the %%ddp line)")
    if spec.launcher != "local":
        if func:
            raise DDPUsageError(f"%%ddp: --launcher {spec.launcher} runs the cell as a script: give its "
                                "source text (a callable runs on nbddp's own ranks: the local launcher)")
        if push:
            raise DDPUsageError(_NO_VALUES_ACROSS.format(launcher=spec.launcher))
        return spec.launcher
    if pool is None or spec.fresh:
        return "local"
    if not pool_ready:
        raise DDPUsageError(f"%%ddp: the pool is broken ({why_broken}); run %ddp_pool restart, or "
                            "%%ddp --fresh for a separate job" if why_broken else
                            "%%ddp: no pool is running; start one with %ddp_pool start -n N")
    if func:
        raise DDPUsageError("%%ddp: a pool runs cells given as source text; run a callable as a "
                            "fresh job (fresh=True)")
    if own_env:
        raise DDPUsageError("%%ddp: cwd and env_base are the pool's own (Pool(cwd=..., base_env=...)); "
                            "give them to Pool, or run a fresh job (fresh=True)")
    check_fits_pool(spec, pool)
    return "pool"



# ------------------------------------------------------------------- the pool
# Options that shape a job: a cell on a running pool cannot change them.
SHAPE_FIELDS = ("master_addr", "master_port", "backend", "env", "legacy_launch", "start_method",
                "script_args", "launcher", "gpus")


def check_fits_pool(spec: LaunchSpec, pool: LaunchSpec) -> None:
    """A cell on a running pool runs on its ranks as they are: it cannot change their shape."""
    default = LaunchSpec()
    changed = [name for name, mine, theirs in (("-n", spec.world_size, pool.world_size),
                                               ("--nnodes", spec.nnodes, pool.nnodes),
                                               ("--nproc-per-node", spec.nproc_per_node, pool.nproc_per_node))
               if mine != theirs]
    changed += [f"--{name.replace('_', '-')}" for name in SHAPE_FIELDS
                if getattr(spec, name) != getattr(default, name) and getattr(spec, name) != getattr(pool, name)]
    if changed:
        raise DDPUsageError(f"%%ddp: a pool of {pool.world_size} ranks is running, so {changed[0]} cannot "
                            f"change here; use --fresh for a separate job, or %ddp_pool restart with new options")


def check_pool_spec(spec: LaunchSpec) -> None:
    """A pool is nbddp's own ranks, kept between cells: the local launcher only."""
    if spec.launcher != "local":
        raise DDPUsageError(f"%ddp_pool: a pool runs on the local launcher only, not --launcher "
                            f"{spec.launcher} (whose ranks end with each cell: run such cells with "
                            f"%%ddp --launcher {spec.launcher})")



# ------------------------------------------------------------ private network
def check_private_net(spec: LaunchSpec, env_name: str, master_is_loopback: bool) -> None:
    """With a private network for the kernel's ranks (``env_name``=1, nbddp/forkserver/privnet.py)
    they reach nothing beyond its loopback, and only the forkserver's children are inside it."""
    if spec.start_method == "spawn":
        raise DDPUsageError("%%ddp: --start-method spawn starts ranks outside the private network "
                            f"that {env_name}=1 gives this kernel's ranks; use the forkserver")
    if not master_is_loopback:
        raise DDPUsageError(f"%%ddp: --master-addr {spec.master_addr} is not this machine's loopback, "
                            f"but with {env_name}=1 ranks reach nothing beyond a private loopback; "
                            f"use --launcher torchrun to meet other machines")
