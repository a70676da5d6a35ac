"""Plain-text view of a launch: each line prefixed with its rank (as torchrun's ``--tee`` does),
stdout to the kernel's stdout and stderr to its stderr, the failure summary itself is the DDPError's to show.

Each rank stream goes through a terminal model (nbddp/views/terminal.py), so a progress bar is one
line: the line being rewritten is shown at the bottom of its stream (``\\r`` + the line, as a
terminal does, which Jupyter renders in place), re-sent at most every PENDING_INTERVAL_S, erased
before any other rank's line is written and shown again after it. ANSI colours pass through
(Jupyter renders them). Bounded: a line keeps at most LINE_LIMIT characters (the line shown in
place, terminal.MAX_LINE), and after
TEXT_LIMIT_CHARS in one launch further lines are counted, not sent (the logs keep everything,
the end-of-cell transcript the last lines of each rank).
"""
from __future__ import annotations

import sys
import time

from nbddp.core import summary
from nbddp.core.sink import Sink
from nbddp.views import terminal
from nbddp.views import transcript
from nbddp.views.terminal import Terminal

PENDING_INTERVAL_S = 0.3      # a rewritten line is re-sent at most ~3 times a second
TEXT_LIMIT_CHARS = 5_000_000  # text sent per launch; the rest stays in the logs
LINE_LIMIT = 2_000_000        # characters of one line sent (a 1 MB line arrives whole)


class TextView(Sink):
    """A sink for Launch events that prints as lines arrive."""

    shows_output = True  # a failed rank's traceback is on screen: the DDPError need not repeat it

    def __init__(self, spec, out=None, err=None, header: bool = True, flush: bool = True):
        self.spec = spec
        self._flush = flush  # False where the next sink's display flushes the streams itself
        self._out = out
        self._err = err
        self.header = header
        self._terms: dict[tuple[int, str], Terminal] = {}
        self._shown: dict[str, tuple[int, int]] = {}   # stream -> (rank, width) of the line shown in place
        self._due: dict[str, set] = {}                   # stream -> ranks whose pending line changed
        self._rank_shown_at: dict[tuple[int, str], float] = {}
        self._shown_at: dict[str, float] = {}
        self._left = TEXT_LIMIT_CHARS
        self._skipped: dict[int, int] = {}               # rank -> lines not sent (over the limit)
        self.pending_writes = 0                          # in-place rewrites sent (for tests)
        self.log_dir = ""

    def _stream(self, stream: str):
        if stream == "stderr":
            return self._err or sys.stderr
        return self._out or sys.stdout

    def launch_started(self, result, spec, backend):
        self.log_dir = result.log_dir
        if self.header:
            self._stream("stdout").write(
                f"nbddp: {transcript.launch_line(result, spec, backend)}, logs in {result.log_dir}\n")

    def output(self, rank: int, stream: str, data: bytes):
        if not self.spec.shown(rank):
            return
        term = self._terms.get((rank, stream))
        if term is None:
            term = self._terms[(rank, stream)] = Terminal(limit=LINE_LIMIT)
        lines = term.feed(data)
        if lines:
            self._write(rank, stream, lines)
        if term.has_pending:
            self._due.setdefault(stream, set()).add(rank)

    def tick(self):
        now = time.monotonic()
        for stream, ranks in list(self._due.items()):
            if ranks and now - self._shown_at.get(stream, 0.0) >= PENDING_INTERVAL_S:
                # one line can be shown in place per stream: the rank shown longest ago goes next
                rank = min(ranks, key=lambda r: self._rank_shown_at.get((r, stream), 0.0))
                ranks.discard(rank)
                self._show_pending(rank, stream, now)

    def _show_pending(self, rank, stream, now):
        term = self._terms.get((rank, stream))
        line = term.pending if term is not None else ""
        if not line or self._left <= 0:
            return
        if len(line) > terminal.MAX_LINE:   # a long line without newline: its start, not MBs a second
            line = line[:terminal.MAX_LINE] + "\x1b[0m …"
        text = f"[rank{rank}]:{line}"   # a styled line ends with its own reset
        width = len(terminal.plain(text))
        self._erase(stream)
        self._stream(stream).write("\r" + text)
        self._shown[stream] = (rank, width)
        self._shown_at[stream] = self._rank_shown_at[(rank, stream)] = now
        self.pending_writes += 1

    def _erase(self, stream):
        """Blank the line shown in place on ``stream`` (spaces over it, cursor back at its start)."""
        shown = self._shown.pop(stream, None)
        if shown is not None:
            self._stream(stream).write("\r" + " " * shown[1] + "\r")
            self._due.setdefault(stream, set()).add(shown[0])   # shown again below the new lines, if still pending

    def _write(self, rank, stream, lines):
        if self._left <= 0:
            self._skipped[rank] = self._skipped.get(rank, 0) + len(lines)
            return
        self._erase(stream)
        prefix = f"[rank{rank}]:"
        text = "".join(f"{prefix}{line}\n" for line in lines)
        self._left -= len(text)
        if self._left <= 0:
            text += (f"nbddp: more than {TEXT_LIMIT_CHARS // 1_000_000} MB of output: further lines are "
                     f"not shown here; every line is in the logs ({self.log_dir})\n")
        self._stream(stream).write(text)

    def note(self, text: str):
        self._erase("stderr")
        self._stream("stderr").write(f"nbddp: {text}\n")

    def asking(self, rank, waiting, purpose):
        if rank is not None:  # the rank's own lines came first; the input box follows
            self.note(summary.asking_line(rank, waiting, purpose))

    def launch_finished(self, result):
        for (rank, stream), term in sorted(self._terms.items()):
            rest = term.flush()
            if rest:
                self._write(rank, stream, rest)
        for stream in ("stdout", "stderr"):
            self._erase(stream)
        self._due.clear()
        if self._skipped:
            counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(self._skipped.items()))
            self._stream("stderr").write(f"nbddp: lines not shown (over the {TEXT_LIMIT_CHARS // 1_000_000} MB "
                                         f"limit) — {counts}; full logs in {result.log_dir}\n")
        for stream in ("stdout", "stderr") if self._flush else ():
            try:
                self._stream(stream).flush()
            except Exception:
                pass
