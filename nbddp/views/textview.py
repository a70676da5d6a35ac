"""Plain-text view of a launch: each line prefixed with its rank (as torchrun's ``--tee``), stdout to
the kernel's stdout, stderr to its stderr; the failure summary is the DDPError's to show. Each
stream goes through a terminal model (nbddp/views/terminal.py): the line being rewritten is shown
last (``\\r`` + the line), re-sent at most every PENDING_INTERVAL_S and blanked (as long as front
ends count it) around other ranks' lines; ``--same-lines merge`` says shared lines once. A
notebook server drops all output above its rate limit (nbddp/core/iopubrate.py), so lines go out
only while they fit a share of it; held-back ones are named in a note. Bounded: LINE_LIMIT a line,
TEXT_LIMIT_CHARS a launch; the logs keep everything."""
from __future__ import annotations

import sys
import time

from nbddp.core import summary
from nbddp.core.iopubrate import SERVER_DATA_RATE, RateWindow, stream_bytes
from nbddp.core.samelines import SameLines
from nbddp.core.sink import Sink
from nbddp.core.summary import label, wrapped
from nbddp.views import terminal, transcript
from nbddp.views.terminal import Terminal

PENDING_INTERVAL_S = 0.3      # a rewritten line is re-sent at most ~3 times a second
TEXT_LIMIT_CHARS = 5_000_000  # text sent per launch; the rest stays in the logs
LINE_LIMIT = 2_000_000        # characters of one line sent (a line of a million characters arrives whole)
RESUME_SHARE = 1 / 3          # held-back output resumes once this share of the window is free
STDERR_RESERVE = 0.2          # of the window kept for stderr (warnings, tracebacks) while stdout floods
REPORT_WAIT_S = 4.0           # the end-of-cell note waits at most this long for room

KERNEL_WINDOW = RateWindow()  # one per kernel: every view's output shares the server's limit
UNPACED = RateWindow(data_rate=float("inf"), msg_rate=float("inf"))   # a terminal: no server between


def front_end_width(text: str) -> int:
    """How many characters a front end overwrites after ``\\r`` for ``text``: raw characters,
    escape codes included, in UTF-16 units (an emoji is two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def prefix(ranks) -> str:
    """``[rank3]:`` (as torchrun's --tee), or ``[ranks 0–7]:`` for a line several ranks printed."""
    return f"[rank{ranks[0]}]:" if len(ranks) == 1 else f"[{label(ranks)}]:"


def _other(stream: str) -> str:
    return "stderr" if stream == "stdout" else "stdout"


class _Held:
    """Lines not written (over the rate or the size limit), by rank and stream, with their line
    numbers in the rank's log file."""

    def __init__(self):
        self.ranges: list = []    # [rank, stream, first, last], not said yet
        self._last: dict = {}     # (rank, stream) -> its latest range
        self.total: dict = {}     # rank -> lines held back in this launch
        self.stderr_ranks: set = set()   # ranks with stderr lines held back (a traceback, perhaps)

    def add(self, rank, stream, number: int) -> None:
        span = self._last.get((rank, stream))
        if span is not None and span[3] + 1 == number:
            span[3] = number
        else:
            span = self._last[(rank, stream)] = [rank, stream, number, number]
            self.ranges.append(span)
        self.total[rank] = self.total.get(rank, 0) + 1
        if stream == "stderr":
            self.stderr_ranks.add(rank)

    def said(self) -> str:
        """The ranges not said yet, in words; forgets them."""
        parts = []
        for rank, stream, a, b in sorted(self.ranges):
            parts.append(f"rank {rank} {stream} " + (f"line {a:,}" if a == b else f"lines {a:,}–{b:,}"))
        self.ranges, self._last = [], {}
        return "; ".join(parts)


class TextView(Sink):
    """A sink for Launch events that prints as lines arrive."""

    shows_output = True  # a failed rank's traceback is on screen: the DDPError need not repeat it

    def __init__(self, spec, out=None, err=None, header: bool = True, flush: bool = True,
                 window: RateWindow | None = None, clock=time.monotonic, sleep=time.sleep):
        self.spec = spec
        self._flush = flush  # False where the next sink's display flushes the streams itself
        self._out = out
        self._err = err
        self.header = header
        self.window = window or UNPACED   # make_sinks passes KERNEL_WINDOW in a Jupyter kernel
        self._clock, self._sleep = clock, sleep
        self._terms: dict[tuple[int, str], Terminal] = {}
        self._shown: dict[str, tuple[int, int]] = {}   # stream -> (rank, width) of the line shown in place
        self._due: dict[str, set] = {}                   # stream -> ranks whose pending line changed
        self._rank_shown_at: dict[tuple[int, str], float] = {}
        self._shown_at: dict[str, float] = {}
        self._left = TEXT_LIMIT_CHARS
        self._lineno: dict[tuple[int, str], int] = {}   # lines each rank stream finished
        self._held = _Held()
        self._holding: set = set()                      # streams whose lines are held back now
        self._merge: dict[str, SameLines] = {}          # stream -> merger (--same-lines merge)
        shown = [r for r in range(spec.world_size) if spec.shown(r)]
        if getattr(spec, "same_lines", "apart") == "merge" and len(shown) > 1:
            self._merge = {s: SameLines(shown) for s in ("stdout", "stderr")}
        self.pending_writes = 0                          # in-place rewrites sent (for tests)
        self.log_dir = ""

    def _stream(self, stream: str):
        if stream == "stderr":
            return self._err or sys.stderr
        return self._out or sys.stdout

    def _send(self, stream: str, text: str, now: float | None = None) -> None:
        self._stream(stream).write(text)
        self.window.charge(self._clock() if now is None else now, stream_bytes(text))

    def launch_started(self, result, spec, backend):
        self.log_dir = result.log_dir
        if self.header:
            self._send("stdout", f"nbddp: {transcript.launch_line(result, spec, backend)}, "
                                 f"logs in {result.log_dir}\n")

    def output(self, rank: int, stream: str, data: bytes):
        if not self.spec.shown(rank):
            return
        term = self._terms.get((rank, stream))
        if term is None:
            term = self._terms[(rank, stream)] = Terminal(limit=LINE_LIMIT)
        lines = term.feed(data)
        if lines:
            self._finished(rank, stream, lines)
        if term.has_pending:
            self._due.setdefault(stream, set()).add(rank)

    def _finished(self, rank, stream, lines):
        """Lines rank ``rank`` finished: written now, or once the other ranks said whether they print them too."""
        merger = self._merge.get(stream)
        if merger is None:
            self._write(stream, [((rank,), line) for line in lines])
            return
        now = self._clock()
        out = []
        for line in lines:
            out += merger.add(rank, line, now)
        if out:
            self._write(stream, out)

    def rank_exited(self, rank_result):
        now = self._clock()
        for stream, merger in self._merge.items():
            rest = self._terms.get((rank_result.rank, stream))
            tail = rest.flush() if rest is not None else []
            out = []
            for line in tail:
                out += merger.add(rank_result.rank, line, now)
            out += merger.ended(rank_result.rank, now)
            if out:
                self._write(stream, out)

    def tick(self):
        now = self._clock()
        for stream, merger in self._merge.items():
            out = merger.due(now)
            if out:
                self._write(stream, out)
        if self._held.ranges and self._left > 0 and self._resumable(now):   # a flood paused: say what was held back
            self._say_held(now)
        for stream, ranks in list(self._due.items()):
            if ranks and now - self._shown_at.get(stream, 0.0) >= PENDING_INTERVAL_S:
                # one line can be shown in place per stream: the rank shown longest ago goes next
                rank = min(ranks, key=lambda r: self._rank_shown_at.get((r, stream), 0.0))
                ranks.discard(rank)
                self._show_pending(rank, stream, now)

    def _room(self, now, stream) -> float:
        """Bytes ``stream`` may write now. stdout leaves a share of the window to stderr, and a
        stream held back resumes only once a good share is free again (so a flood is said in a
        few notes, not one per line)."""
        room = self.window.room(now)
        if room == float("inf"):   # no server between (a terminal)
            return room
        room -= self.window.max_bytes * STDERR_RESERVE if stream == "stdout" else 0
        if stream in self._holding and room < self.window.max_bytes * RESUME_SHARE:
            return 0
        return max(0, room)

    def _resumable(self, now) -> bool:
        return all(self._room(now, s) > 0 for s in self._holding or ("stderr",))

    def _show_pending(self, rank, stream, now):
        term = self._terms.get((rank, stream))
        line = term.pending if term is not None else ""
        if not line or self._left <= 0 or self._holding:
            return
        if len(line) > terminal.MAX_LINE:   # a long line without newline: its start, not MBs a second
            line = line[:terminal.MAX_LINE] + "\x1b[0m …"
        text = f"[rank{rank}]:{line}"   # a styled line ends with its own reset
        if not self.window.fits(now, stream_bytes(text) + front_end_width(text) + 4):
            return
        self._erase(stream)
        self._flush_stream(_other(stream))   # what the other stream has waiting goes out before this line
        self._send(stream, "\r" + text, now)
        self._shown[stream] = (rank, front_end_width(text))
        self._shown_at[stream] = self._rank_shown_at[(rank, stream)] = now
        self.pending_writes += 1

    def _erase(self, stream):
        """Blank the lines shown in place before writing to ``stream`` (spaces over them, cursor
        back at the start). The other stream's too: front ends put a stream's text after the
        other stream's into a new output, where a \r no longer reaches the old line; that blank
        is flushed first, so it arrives before what follows on this stream."""
        for name in (stream, _other(stream)):
            shown = self._shown.pop(name, None)
            if shown is None:
                continue
            self._send(name, "\r" + " " * shown[1] + "\r")
            self._due.setdefault(name, set()).add(shown[0])   # shown again below the new lines, if still pending
            if name != stream:
                self._flush_stream(name)

    def _flush_stream(self, name):
        """Send what ``name`` holds now. ipykernel batches each stream on its own (0.2 s), so
        without this a line shown in place on one stream could reach the front end before text
        written earlier to the other, which would then start a new output below it."""
        try:
            self._stream(name).flush()   # ipykernel: bounded by its flush_timeout
        except Exception:
            pass

    def _number(self, stream, entries) -> list:
        """Each entry's first line number per rank (as in the rank's log file)."""
        numbered = []
        for ranks, line in entries:
            firsts = []
            for r in ranks:
                n = self._lineno.get((r, stream), 0) + 1
                self._lineno[(r, stream)] = n
                firsts.append(n)
            numbered.append((ranks, line, firsts))
        return numbered

    def _write(self, stream, entries):
        """Write (ranks, line) entries, as far as they fit; the rest is held back and said."""
        numbered = self._number(stream, entries)
        now = self._clock()
        if self._left > 0 and self._held.ranges and self._resumable(now):
            self._say_held(now)
        texts = [f"{prefix(ranks)}{line}\n" for ranks, line, _ in numbered]
        room = self._room(now, stream) if self._left > 0 else 0
        if not room:
            keep = 0
        else:
            self._holding.discard(stream)
            capped = room >= self._left   # the size limit, not the rate, is what is left
            room = min(room, self._left)
            text = "".join(texts)
            cost = stream_bytes(text)
            if cost <= room:
                keep = len(texts)
            else:   # a flood: the lines that fit, the rest held back
                keep, cost = 0, 0
                for t in texts:
                    c = stream_bytes(t) - 2   # without the quotes the whole text has once
                    if cost + c > room:
                        break
                    keep, cost = keep + 1, cost + c
                text = "".join(texts[:keep])
            if keep:
                self._erase(stream)
                self._send(stream, text, now)
                self._left -= cost
            if capped and keep < len(texts):
                self._left = 0
                held = wrapped(f"nbddp: {self._why_held()}: further lines are not shown here (how many: at the end); "
                               f"every line is in the logs: {self.log_dir}")
                self._send("stderr", held + "\n", now)
        if keep < len(numbered):
            self._holding.add(stream)
            for ranks, _, firsts in numbered[keep:]:
                for r, n in zip(ranks, firsts, strict=True):
                    self._held.add(r, stream, n)

    def _why_held(self) -> str:
        if self._left <= 0:
            return f"more than {TEXT_LIMIT_CHARS // 1_000_000} MB of output in this cell"
        return (f"output faster than the notebook server passes on "
                f"({SERVER_DATA_RATE / 1e6:g} MB/s; above that it drops everything)")

    def _say_held(self, now):
        spans = self._held.said()
        self._holding = set()
        self._erase("stderr")
        self._send("stderr", wrapped(f"nbddp: not shown here ({self._why_held()}): {spans}; every line is "
                                     f"in the logs: {self.log_dir}") + "\n", now)

    def note(self, text: str):
        self._erase("stderr")
        self._send("stderr", wrapped(f"nbddp: {text}") + "\n")

    def asking(self, rank, waiting, purpose):
        if rank is not None:  # the rank's own lines came first; the input box follows
            self.note(summary.asking_line(rank, waiting, purpose))

    def launch_finished(self, result):
        for (rank, stream), term in sorted(self._terms.items()):
            rest = term.flush()
            if rest:
                self._finished(rank, stream, rest)
        for stream, merger in self._merge.items():
            out = merger.flush()
            if out:
                self._write(stream, out)
        for stream in ("stdout", "stderr"):
            self._erase(stream)
        self._due.clear()
        if self._held.stderr_ranks:   # the DDPError then carries their tracebacks itself
            result.displayed = [r for r in getattr(result, "displayed", []) if r not in self._held.stderr_ranks]
        if self._held.total:
            total = sum(self._held.total.values())
            counts = "; ".join(f"rank {r}: {n:,}" for r, n in sorted(self._held.total.items()))
            spans = self._held.said()
            text = (f"nbddp: {total:,} line{'s' if total != 1 else ''} not shown here ({counts}): "
                    f"{self._why_held()}{f'; the last: {spans}' if spans else ''}. Every line is in the logs: "
                    f"{result.log_dir} (_ddp.ranks[i].stdout reads them)\n")
            self._report(wrapped(text.rstrip("\n")) + "\n")
        for stream in ("stdout", "stderr") if self._flush else ():
            try:
                self._stream(stream).flush()
            except Exception:
                pass

    def _report(self, text):
        """The end-of-cell note: it waits (a bounded while) for room in the server's window, so it
        and the report after it (the transcript, the DDPError) arrive."""
        now = self._clock()
        wait = min(self.window.wait_for(now, stream_bytes(text) + 2_000, msgs=4), REPORT_WAIT_S)
        if wait > 0:
            self._sleep(wait)
        self._send("stderr", text)
