"""``%ddp_diff`` / ``--diff``: the ranks' summaries of the named objects compared (pure).

Each rank sends one summary: per tensor (or generator state, or plain value) its name, kind,
dtype, shape and a hash of its bytes, never the values. Compared against rank 0, the first
differing tensors are computed (their max abs difference, by the ranks that differ, against
rank 0's copy); the report names each differing entry and the ranks it differs on. Both sides
use this module: the ranks pick what to compute, the kernel words the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbddp.core.summary import label

COMPUTED = 5        # differing tensors whose max abs difference is computed (bounded work and disk)
SHOWN = 10          # differing entries the report lists
COMPUTED_BYTES = 1 << 28  # at most this much of rank 0's tensors is written for the others to read
WAIT = 120.0        # s a rank waits for the others' files (a slower rank's cell may still be running)
TENSOR, RNG, VALUE = "tensor", "rng", "value"  # what an entry is: a tensor, a generator's state, a scalar

# one entry of a rank's summary: [name, kind, dtype, shape, hash, value shown (VALUE only)]
Entry = list[Any]
Summary = dict[str, Any]  # {"entries": [Entry, ...], "problems": [one line each]}


@dataclass(frozen=True)
class Difference:
    """One entry that is not the same on every rank: ``ranks`` differ from rank 0 (why: "value",
    "shape", "dtype", "kind", "missing" on those ranks, or "extra": not on rank 0)."""

    name: str
    kind: str
    ranks: tuple[int, ...]
    why: str
    ref: Entry | None                      # rank 0's entry
    theirs: tuple[Entry | None, ...]       # the differing ranks' entries, in ``ranks`` order


@dataclass(frozen=True)
class Comparison:
    world: int
    count: dict[str, int]                  # entries of each kind compared (on rank 0)
    differences: list[Difference]


def problems(summaries: dict[int, Summary]) -> str | None:
    """The one line naming what some rank could not summarize (a name it lacks, an object of
    another kind), the ranks beside each; None when every rank summarized every name."""
    seen: dict[str, list[int]] = {}
    for rank in sorted(summaries):
        for why in summaries[rank].get("problems", []):
            seen.setdefault(why, []).append(rank)
    if not seen:
        return None
    world = len(summaries)
    return "; ".join(why if len(ranks) == world else f"{why} (on {label(ranks)})" for why, ranks in seen.items())


def compare(summaries: dict[int, Summary]) -> Comparison:
    """Every rank's entries against rank 0's, in rank 0's order (entries only another rank
    has come after)."""
    world = len(summaries)
    tables = {rank: {entry[0]: entry for entry in summaries[rank]["entries"]} for rank in summaries}
    names = [entry[0] for entry in summaries[0]["entries"]]
    known = set(names)
    for rank in sorted(summaries):
        for entry in summaries[rank]["entries"]:
            if entry[0] not in known:
                known.add(entry[0])
                names.append(entry[0])
    count: dict[str, int] = {}
    for entry in summaries[0]["entries"]:
        count[entry[1]] = count.get(entry[1], 0) + 1
    differences = []
    for name in names:
        ref = tables[0].get(name)
        odd: dict[str, list[int]] = {}
        for rank in range(1, world):
            why = _why(ref, tables[rank].get(name))
            if why:
                odd.setdefault(why, []).append(rank)
        for why, ranks in odd.items():
            kind = (ref or next(tables[r][name] for r in ranks))[1]
            differences.append(Difference(name, kind, tuple(ranks), why, ref,
                                          tuple(tables[r].get(name) for r in ranks)))
    return Comparison(world, count, differences)


def _why(ref: Entry | None, other: Entry | None) -> str | None:
    if ref is None:
        return None if other is None else "extra"
    if other is None:
        return "missing"
    for index, why in ((1, "kind"), (2, "dtype"), (3, "shape"), (4, "value")):
        if ref[index] != other[index]:
            return why
    return None


def to_compute(comparison: Comparison) -> list[tuple[str, tuple[int, ...]]]:
    """The first ``COMPUTED`` tensors whose values (not shapes) differ, with the ranks that
    differ: rank 0 writes these (``COMPUTED_BYTES`` in all), those ranks compute them against it."""
    picked: dict[str, list[int]] = {}
    room = COMPUTED_BYTES
    for diff in comparison.differences:
        if diff.kind == TENSOR and diff.why == "value" and diff.ref is not None:
            if diff.name not in picked and len(picked) < COMPUTED and _nbytes(diff.ref) <= room:
                room -= _nbytes(diff.ref)
                picked[diff.name] = []
            if diff.name in picked:
                picked[diff.name].extend(diff.ranks)
    return [(name, tuple(sorted(ranks))) for name, ranks in picked.items()]


_ITEMSIZE = {"float64": 8, "int64": 8, "complex64": 8, "uint64": 8, "complex128": 16, "float32": 4,
             "int32": 4, "uint32": 4, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2}


def _nbytes(entry: Entry) -> int:
    count = 1
    for size in entry[3]:
        count *= size
    return count * _ITEMSIZE.get(entry[2], 1 if entry[2] in ("bool", "int8", "uint8") else 8)


def report(comparison: Comparison, computed: dict[int, dict[str, float]], who: str = "%ddp_diff") -> str:
    """The lines shown: "all N ranks equal (K tensors)", or the first differing entries, each
    with its ranks and how it differs (the max abs difference where computed)."""
    counted = ", ".join(f"{n} {_plural(kind, n)}" for kind, n in sorted(comparison.count.items(),
                                                                         key=lambda kv: _ORDER[kv[0]]))
    head = f"{who}: "
    diffs = comparison.differences
    if not diffs:
        return f"{head}all {comparison.world} ranks equal ({counted or 'nothing to compare'})"
    names = list(dict.fromkeys(d.name for d in diffs))
    lines = [f"{head}{len(names)} of {_total(comparison)} differ across the {comparison.world} ranks "
             f"(each against rank 0):"]
    shown = [d for d in diffs if d.name in names[:SHOWN]]
    width = min(max(len(d.name) for d in shown), 48)
    rank_width = max(len(label(d.ranks)) for d in shown)
    for diff in shown:
        lines.append(f"  {diff.name:<{width}}  {label(diff.ranks):<{rank_width}}  {_how(diff, computed)}")
    if len(names) > SHOWN:
        lines.append(f"  … and {len(names) - SHOWN} more")
    if _odd_one_out(comparison):
        lines.append(f"  (ranks 1–{comparison.world - 1} agree with each other: rank 0 is the odd one)")
    return "\n".join(lines)


_ORDER = {TENSOR: 0, VALUE: 1, RNG: 2}


def _plural(kind: str, n: int) -> str:
    word = {TENSOR: "tensor", VALUE: "other value", RNG: "generator state"}[kind]
    return word if n == 1 else word + "s"


def _total(comparison: Comparison) -> str:
    return f"{sum(comparison.count.values())} entries" if len(comparison.count) > 1 else \
        f"{sum(comparison.count.values())} {_plural(next(iter(comparison.count), TENSOR), 2)}"


def _how(diff: Difference, computed: dict[int, dict[str, float]]) -> str:
    ref = diff.ref
    if diff.why == "extra":
        return "not on rank 0"
    if diff.why == "missing":
        return "missing there (rank 0 has it)"
    if diff.why in ("shape", "dtype", "kind"):
        index = {"kind": 1, "dtype": 2, "shape": 3}[diff.why]
        theirs = sorted({_shown(e[index]) for e in diff.theirs if e is not None})
        return f"{diff.why} {' / '.join(theirs)} vs {_shown(ref[index])} on rank 0" if ref else diff.why
    if diff.kind == RNG:
        return "generator state differs (seeded or drawn differently)"
    if diff.kind == VALUE:
        theirs = sorted({str(e[5]) for e in diff.theirs if e is not None})
        return f"{' / '.join(theirs)} vs {ref[5]} on rank 0" if ref else "differs"
    got = {rank: computed.get(rank, {}).get(diff.name) for rank in diff.ranks}
    known = {rank: value for rank, value in got.items() if value is not None}
    if not known:
        return f"values differ (max abs diff computed for the first {COMPUTED} only, {COMPUTED_BYTES >> 20} MiB in all)"
    if len(diff.ranks) == 1:
        return f"max abs diff {_number(known[diff.ranks[0]])}"
    top = max(known, key=lambda r: known[r])
    return f"max abs diff {_number(known[top])} (largest, on rank {top})"


def _shown(value: object) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def _number(value: float) -> str:
    return f"{value:.4g}"


def _odd_one_out(comparison: Comparison) -> bool:
    """Every difference is rank 0 against all the others, which agree among themselves."""
    if comparison.world < 3:
        return False
    others = tuple(range(1, comparison.world))
    for diff in comparison.differences:
        if diff.ranks != others or len({repr(e) for e in diff.theirs}) != 1:
            return False
    return True
