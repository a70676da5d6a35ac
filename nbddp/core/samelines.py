"""Identical lines from several ranks said once: ``[ranks 0–7]: epoch 1 done`` instead of eight
lines (``--same-lines merge``, the default; ``apart`` shows each rank's line).

A line is held until every rank still expected has printed it, has gone on to print something
else, or for HOLD_S at most; then it goes out with the ranks that printed it. Lines go out in
the order first printed, and each rank's own lines keep their order. Bounded: at most MAX_OPEN
lines are held, the oldest go out first. Pure: the caller passes the clock and says when a rank
ends."""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable

HOLD_S = 0.5        # the longest a line waits for other ranks to print it too
MAX_OPEN = 10_000   # lines held at once


class _Group:
    __slots__ = ("seq", "key", "ranks", "born")

    def __init__(self, seq: int, key: Hashable, rank: int, born: float) -> None:
        self.seq, self.key, self.ranks, self.born = seq, key, [rank], born


Released = tuple[tuple[int, ...], Hashable]  # the ranks that printed a line (ascending), and its key


class SameLines:
    """Feed (rank, key) as lines finish; get back (ranks, key) for lines that may go out, ranks
    in ascending order. ``key`` is anything hashable: the line, or (stream, line)."""

    def __init__(self, ranks: Iterable[int], hold_s: float = HOLD_S, max_open: int = MAX_OPEN) -> None:
        self.expected = set(ranks)
        self.hold_s = hold_s
        self.max_open = max_open
        self._open: deque[_Group] = deque()   # held groups, in first-printed order
        self._by_key: dict[Hashable, deque[_Group]] = {}  # key -> its held groups, in order
        self._last: dict[int, int] = {}       # rank -> seq of its latest group
        self._seq = 0

    def __len__(self) -> int:
        return len(self._open)

    def add(self, rank: int, key: Hashable, now: float) -> list[Released]:
        """Rank ``rank`` finished line ``key``; returns what may go out now."""
        last = self._last.get(rank, -1)
        same = self._by_key.get(key)
        group = None
        if same:
            i = bisect.bisect_right(same, last, key=lambda g: g.seq)   # after the rank's own lines
            if i < len(same):
                group = same[i]
                group.ranks.append(rank)
        if group is None:
            self._seq += 1
            group = _Group(self._seq, key, rank, now)
            self._open.append(group)
            self._by_key.setdefault(key, deque()).append(group)
        self._last[rank] = group.seq
        return self.due(now)

    def ended(self, rank: int, now: float) -> list[Released]:
        """Rank ``rank`` will print nothing more: no line waits for it."""
        self.expected.discard(rank)
        return self.due(now)

    def due(self, now: float) -> list[Released]:
        """The held lines that may go out at ``now``, oldest first."""
        out = []
        while self._open and self._ready(self._open[0], now):
            out.append(self._release())
        return out

    def flush(self) -> list[Released]:
        """Everything held (the launch ended)."""
        return [self._release() for _ in range(len(self._open))]

    def _ready(self, group: _Group, now: float) -> bool:
        if len(self._open) > self.max_open or now - group.born >= self.hold_s:
            return True
        # every expected rank not in it printed it, or has printed something later instead
        return all(self._last.get(r, -1) >= group.seq for r in self.expected)

    def _release(self) -> Released:
        group = self._open.popleft()
        same = self._by_key[group.key]
        same.popleft()   # groups of a key are released in order too
        if not same:
            del self._by_key[group.key]
        return tuple(sorted(group.ranks)), group.key
