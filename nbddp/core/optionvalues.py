"""The values ``%%ddp``'s options take: the parser's converters (text → value, or argparse's
error) and each LaunchSpec field's type and range, checked again for the Python API, which may
be given anything. Pure; a bad value is a ``DDPUsageError`` naming the option."""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard, TypeVar

from nbddp.core.errors import DDPUsageError
from nbddp.core.spec import LaunchSpec

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def positive_int(name: str) -> Callable[[str], int]:
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {shown(text)}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value
    return conv


def nonneg_int(name: str) -> Callable[[str], int]:
    def conv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {shown(text)}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be 0 or more, got {value}")
        return value
    return conv


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be a number, got {shown(text)}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 1 and 65535, got {value}")
    return value


def seconds(name: str) -> Callable[[str], float]:
    def conv(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {shown(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, got {shown(text)}")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{name} must be more than 0 seconds, got {text}")
        return value
    return conv


def seconds_or_off(name: str) -> Callable[[str], float]:
    """Seconds, or 0 to turn the feature off (stored as None)."""
    def conv(text: str) -> float:
        if text.strip() in ("0", "0.0", "off", "none"):
            return 0.0
        return seconds(name)(text)
    return conv


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not ENV_KEY.match(key):
        raise argparse.ArgumentTypeError(f"--env takes KEY=VALUE, got {shown(text)}")
    return key, value


def int_list(name: str) -> Callable[[str], tuple[int, ...]]:
    def conv(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(part) for part in text.split(",") if part.strip() != "")
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes numbers separated by commas, got {shown(text)}") from None
        if not values or min(values) < 0:
            raise argparse.ArgumentTypeError(f"{name} takes numbers 0 or more separated by commas, got {shown(text)}")
        return values
    return conv


def names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(@\d+)?$", name):
            raise argparse.ArgumentTypeError(f"not a Python name: {shown(name)}")
    return names


def diff_names(text: str) -> tuple[str, ...]:
    """What --diff and %ddp_diff compare: notebook names (``model``, ``model.fc``, ``model.0``, ``opt``) and
    ``rng`` (the ranks' generators), split on commas or spaces."""
    found = tuple(part for part in re.split(r"[\s,]+", text) if part)
    for name in found:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$", name):
            raise argparse.ArgumentTypeError(f"not a Python name: {shown(name)}")
    if not found:
        raise argparse.ArgumentTypeError("no name given")
    return found


_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2}|unlimited|infinite)$", re.I)


def slurm_time(text: str) -> str:
    if not _SLURM_TIME.match(text.strip()):
        raise argparse.ArgumentTypeError(f"--time takes Slurm's MINUTES, HH:MM:SS or D-HH:MM:SS, got {shown(text)}")
    return text.strip()


def slurm_name(flag: str) -> Callable[[str], str]:
    def conv(text: str) -> str:
        if not re.match(r"^[\w.,@+-]+$", text):
            raise argparse.ArgumentTypeError(f"{flag} takes a Slurm name, got {shown(text)}")
        return text
    return conv


def sbatch_line(text: str) -> str:
    line = re.sub(r"^#SBATCH\s+", "", text.strip())
    if not line.startswith("-") or "\n" in line:
        raise argparse.ArgumentTypeError(f"--sbatch takes one sbatch option such as '--qos=high', got {shown(text)}")
    return line


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_seconds(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def shown(value: object) -> str:
    """A value in a message: its repr, cut (a hostile value can be a megabyte, and an int of
    more than 4300 digits has no repr at all)."""
    if is_int(value) and huge(value):
        return f"a {value.bit_length()}-bit number"
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


HUGE = 1 << 63  # no count, port or number of seconds nbddp takes is this large


def huge(value: int) -> bool:
    return not -HUGE < value < HUGE


_FLAGS = {"ranks_shown": "--ranks", "time_limit": "--time"}


def flag(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def ints(value: object) -> bool:
    return isinstance(value, tuple) and all(is_int(v) for v in value)


def texts(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


_INT, _OPT_INT = (is_int, "a whole number"), (lambda v: v is None or is_int(v), "a whole number")
_STR, _OPT_STR = (lambda v: isinstance(v, str), "text"), (lambda v: v is None or isinstance(v, str), "text")
_OPT_SECONDS = (lambda v: v is None or is_seconds(v), "a number of seconds")
_BOOL = (lambda v: isinstance(v, bool), "True or False")
# what each LaunchSpec field takes, as the Python API may be given anything
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "nproc_per_node": _INT, "nnodes": _INT, "node_rank": _OPT_INT, "master_addr": _STR,
    "master_port": (lambda v: v is None or is_int(v), "a port number (an int)"), "backend": _STR,
    "timeout": _OPT_SECONDS, "idle_warning": _OPT_SECONDS,
    "env": (lambda v: isinstance(v, tuple) and all(texts(p) and len(p) == 2 for p in v), "KEY=VALUE pairs"),
    "legacy_launch": _OPT_STR, "start_method": _STR,
    "ranks_shown": (lambda v: v is None or ints(v), "rank numbers"), "output": _STR, "same_lines": _OPT_STR,
    "log_dir": _OPT_STR, "script_args": (texts, "a list of text arguments"), "launcher": _STR,
    "fresh": _BOOL, "push": (texts, "names"), "pull": (texts, "names"), "diff": (texts, "names"),
    "rdzv_endpoint": _OPT_STR,
    "rdzv_backend": _STR, "rdzv_id": _OPT_STR, "max_restarts": _INT, "rdzv_timeout": _OPT_SECONDS,
    "gpus": (lambda v: v is None or ints(v), "device numbers"), "export": _OPT_STR, "slurm": _BOOL,
    "partition": _OPT_STR, "account": _OPT_STR, "time_limit": _OPT_STR,
    "sbatch": (texts, "#SBATCH options"), "pdb": _BOOL, "max_ranks": _OPT_INT,
    "exit_grace": (is_seconds, "a number of seconds"), "ray_address": _OPT_STR, "ray": _BOOL,
    "fake": _BOOL,
}
assert set(_TYPES) == set(LaunchSpec.__dataclass_fields__)
MAX_SECONDS = 365 * 24 * 3600.0  # any longer is a typo (and past what some waits accept)


def check_types(spec: LaunchSpec) -> None:
    """Each field of the type it must have, its text passable to a process (argv, environment,
    a path: no NUL, no lone surrogate) and its numbers finite and in range."""
    for name, (ok, takes) in _TYPES.items():
        value = getattr(spec, name)
        if not ok(value):
            raise DDPUsageError(f"%%ddp: {flag(name)} takes {takes}, got {shown(value)}")
        if any(huge(v) for v in ints_in(value)):
            raise DDPUsageError(f"%%ddp: {flag(name)} takes a number below 2**63, got {shown(value)}")
        for text in strings(value):
            if "\0" in text:
                raise DDPUsageError(f"%%ddp: {flag(name)} cannot hold a NUL character, got {shown(text)}")
            try:
                text.encode("utf-8")
            except UnicodeError:
                raise DDPUsageError(f"%%ddp: {flag(name)} is not valid text (a lone surrogate), "
                                    f"got {shown(text)}") from None
    for name in ("timeout", "idle_warning", "rdzv_timeout", "exit_grace"):
        value = getattr(spec, name)
        if value is None:
            continue
        least = 0 if name == "idle_warning" else None  # --idle-warning 0 turns it off
        if isinstance(value, float) and not math.isfinite(value):
            raise DDPUsageError(f"%%ddp: {flag(name)} takes a number of seconds, got {value}")
        if not (value >= 0 if least == 0 else value > 0):
            more = "0 seconds or more" if least == 0 else "more than 0 seconds"
            raise DDPUsageError(f"%%ddp: {flag(name)} must be {more}, got {value}")
        if value > MAX_SECONDS:
            raise DDPUsageError(f"%%ddp: {flag(name)} {shown(value)} seconds is more than a year")
    for name in ("node_rank", "max_restarts"):
        if getattr(spec, name) is not None and getattr(spec, name) < 0:
            raise DDPUsageError(f"%%ddp: {flag(name)} must be 0 or more, got {getattr(spec, name)}")
    if spec.max_ranks is not None and spec.max_ranks < 1:
        raise DDPUsageError(f"%%ddp: --max-ranks must be at least 1, got {spec.max_ranks}")
    for name, check in (("partition", slurm_name("--partition")), ("account", slurm_name("--account")),
                        ("time_limit", slurm_time)):
        if getattr(spec, name) is not None:
            as_usage(check, getattr(spec, name))
    for line in spec.sbatch:
        as_usage(sbatch_line, line)
    for item in spec.diff:
        if as_usage(diff_names, item) != (item,):
            raise DDPUsageError(f"%%ddp: --diff takes one name per item, got {shown(item)}")
    for name in ("push", "pull"):
        for item in getattr(spec, name):
            if as_usage(names, item) != (item,):
                raise DDPUsageError(f"%%ddp: --{name} takes one name per item, got {shown(item)}")
    if spec.legacy_launch not in (None, "dash", "underscore"):
        raise DDPUsageError(f"%%ddp: --legacy-launch must be dash or underscore, got {shown(spec.legacy_launch)}")


def ints_in(value: object) -> Iterator[int]:
    if is_int(value):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from ints_in(item)


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from strings(item)


_T = TypeVar("_T")


def as_usage(conv: Callable[[str], _T], text: str) -> _T:
    """One of the parser's converters, for a value the Python API was given."""
    try:
        return conv(text)
    except argparse.ArgumentTypeError as exc:
        raise DDPUsageError(f"%%ddp: {exc}") from None
