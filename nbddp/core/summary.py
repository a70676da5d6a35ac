"""Ranks in the same state said once: "ranks 0–10,12–15: terminated (stopped by nbddp after rank
11 failed)" instead of fifteen lines, so the one rank that broke stands out — in the DDPError,
the transcript and the chips. Pure."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from nbddp.core.states import CAUSING, RankState  # CAUSING: never folded together


class RankLike(Protocol):
    """What a summary reads of a rank's result (nbddp/core/result.py's RankResult, named by its
    shape: result.py imports this module)."""

    @property
    def rank(self) -> int: ...

    @property
    def state(self) -> RankState: ...

    @property
    def cause(self) -> str: ...


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] → '0–2,5'."""
    nums = sorted(ranks)
    parts: list[str] = []
    start: int | None = None
    for i, n in enumerate(nums):
        if start is None:
            start = n
        if i + 1 == len(nums) or nums[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}–{n}")
            start = None
    return ",".join(parts)


def label(ranks: Iterable[int]) -> str:
    """The one way nbddp names a set of ranks: [3] → 'rank 3', [0, 1, 2, 3] → 'ranks 0–3'."""
    ranks = list(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"


def groups(rank_results: Iterable[RankLike], fold_causing: bool = False) -> list[tuple[list[int], RankState, str]]:
    """(ranks, state, cause) groups in order of first appearance: a rank that caused the failure
    keeps a group of its own (its cause is its own) unless ``fold_causing``."""
    out: dict[tuple[object, ...], tuple[list[int], RankState, str]] = {}
    for r in rank_results:
        key = (r.state, r.cause) if (fold_causing or r.state not in CAUSING) else (r.state, r.cause, r.rank)
        out.setdefault(key, ([], r.state, r.cause))[0].append(r.rank)
    return list(out.values())


def state_lines(rank_results: Iterable[RankLike], include_ok: bool = False) -> list[str]:
    """One line per group of ranks in the same state, the failed ones first."""
    lines = []
    for ranks, state, cause in sorted(groups(rank_results), key=lambda g: g[1] not in CAUSING):
        if state == RankState.OK and not include_ok:
            continue
        lines.append(f"{label(ranks)}: {state}" + (f" ({cause})" if cause else ""))
    return lines


def asking_line(rank: int | None, waiting: list[int], purpose: str | None) -> str:
    """Who is at a prompt in the notebook's input box and who waits (nbddp/sources/asking.py)."""
    waits = f"; {label(waiting)} wait{'s' if len(list(waiting)) == 1 else ''} for it" if waiting else ""
    if rank is None:
        return f"no rank is at a prompt{waits}" if waits else "no rank is at a prompt now"
    what = "asks for input" if purpose == "input" else "is in the debugger"
    return f"rank {rank} {what} (answer in the input box){waits}"


WIDTH = 100   # columns of nbddp's own report lines: JupyterLab breaks a longer <pre> line anywhere


def wrapped(text: str, width: int = WIDTH, indent: str = "  ") -> str:
    """Each long line of ``text`` broken into lines of at most ``width`` columns, the added ones
    starting with ``indent`` (after the line's own): between clauses ("; ", ". ") where it can,
    so "rank 1 blocked at cell line 8: dist.barrier()" stays whole, else between words; never
    inside a word (JupyterLab's output CSS, ``word-break: break-all``, breaks "d|ist.barrier()")."""
    return "\n".join(_wrap_line(line, width, indent) for line in text.split("\n"))


def _wrap_line(line: str, width: int, indent: str) -> str:
    if len(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip(" "))]
    lines: list[str] = []
    current = lead

    def fits(piece: str) -> bool:
        return len(current) + len(piece.rstrip()) <= width

    for clause in re.findall(r".+?(?:[;.] (?=\S)|$)", line[len(lead):]):
        if fits(clause):
            current += clause
            continue
        if current.strip():
            lines.append(current.rstrip())
            current = lead + indent
        if fits(clause):
            current += clause
            continue
        for word in clause.split(" "):   # a clause longer than a line: between its words
            if word:
                if current.strip() and len(current) + len(word) > width:
                    lines.append(current.rstrip())
                    current = lead + indent
                current += word + " "
    lines.append(current.rstrip())
    return "\n".join(lines)
