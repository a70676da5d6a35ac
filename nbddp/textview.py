"""Plain-text view of a launch: each line prefixed with its rank (as torchrun's ``--tee`` does),
stdout to the kernel's stdout and stderr to its stderr, the failure summary itself is the DDPError's to show."""
from __future__ import annotations

import sys

from . import transcript
from .lines import LineSplitter


class TextView:
    """A sink for Launch events that prints as lines arrive."""

    def __init__(self, spec, out=None, err=None, header: bool = True):
        self.spec = spec
        self._out = out
        self._err = err
        self.header = header
        self._splitters: dict[tuple[int, str], LineSplitter] = {}

    def _stream(self, stream: str):
        if stream == "stderr":
            return self._err or sys.stderr
        return self._out or sys.stdout

    def launch_started(self, result, spec, backend):
        if self.header:
            self._stream("stdout").write(
                f"nbddp: {transcript.launch_line(result, spec, backend)}, logs in {result.log_dir}\n")

    def output(self, rank: int, stream: str, data: bytes):
        if not self.spec.shown(rank):
            return
        splitter = self._splitters.setdefault((rank, stream), LineSplitter())
        lines = splitter.feed(data)
        if lines:
            self._write(rank, stream, lines)

    def _write(self, rank, stream, lines):
        prefix = f"[rank{rank}]:"
        target = self._stream(stream)
        target.write("".join(f"{prefix}{line}" for line in lines))

    def note(self, text: str):
        self._stream("stderr").write(f"nbddp: {text}\n")

    def launch_finished(self, result):
        for (rank, stream), splitter in sorted(self._splitters.items()):
            rest = splitter.flush()
            if rest:
                self._write(rank, stream, [rest[0] + "\n"])
        for stream in ("stdout", "stderr"):
            try:
                self._stream(stream).flush()
            except Exception:
                pass
