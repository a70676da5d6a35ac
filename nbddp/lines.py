"""Bytes from a rank's pipe to whole text lines: decoded incrementally (a UTF-8 character split
across two reads stays whole; bytes that are not UTF-8 become U+FFFD instead of an error)."""
from __future__ import annotations

import codecs


class LineSplitter:
    """Feed raw chunks, get back the complete lines (each ending in a newline)."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(data)
        if "\n" not in text:
            self._partial = text
            return []
        head, _, self._partial = text.rpartition("\n")
        return [line + "\n" for line in head.split("\n")]

    def flush(self) -> list[str]:
        """What is left at the end of the stream (a last line without newline)."""
        text = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [text] if text else []
