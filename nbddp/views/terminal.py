"""A rank stream as a terminal would show it: ``\\r`` returns to the start of the line and the next
characters overwrite it, ``\\n`` ends it, ANSI SGR (colour, bold, ...) is kept as styling, every
other escape is dropped; so a tqdm bar is one line that changes. Pure, and cheap on floods: a chunk
without ``\\r``, ``\\b`` or ESC is split on newlines in bulk, and a line keeps at most ``limit``
characters (the rest is counted, not kept; the full bytes stay in the rank's log). A line is a
``str`` whose styled runs start with a canonical SGR sequence (``\\x1b[1;32m``) and that ends with
``\\x1b[0m`` if it has any; ``plain`` strips them, ``to_html`` makes ``<span style=...>``."""
from __future__ import annotations

import codecs
import functools
import html
import re

MAX_LINE = 2000

# one token: an escape sequence (CSI, OSC, two-byte), or \r, \n, \b, or a run of other text
_TOKEN = re.compile(r"\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]"
                    r"|(\r)|(\n)|(\x08)|([^\x1b\r\n\x08]+)")
# an escape sequence cut off at the end of a chunk: kept for the next chunk (up to this length)
_INCOMPLETE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[ -/]*)?$")
_CARRY_MAX = 256
_SGR_RE = re.compile(r"\x1b\[([0-9;]*)m")

_COLORS = ["#000000", "#cd3131", "#0dbc79", "#949800", "#2472c8", "#bc3fbc", "#11a8cd", "#8a8a8a"]
_BRIGHT = ["#666666", "#f14c4c", "#23d18b", "#b5ba00", "#3b8eea", "#d670d6", "#29b8db", "#e5e5e5"]


class _Style:
    """The SGR state: fg, bg, bold, dim, italic, underline, inverse."""

    __slots__ = ("fg", "bg", "flags")

    def __init__(self) -> None:
        self.fg: str | None = None  # SGR colour codes, None: the default
        self.bg: str | None = None
        self.flags: frozenset[int] = frozenset()  # SGR codes on: bold, dim, italic, underline, inverse

    def apply(self, params: str) -> None:
        codes = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                self.fg = self.bg = None
                self.flags = frozenset()
            elif c in (1, 2, 3, 4, 7):
                self.flags = self.flags | {c}
            elif c in (22, 23, 24, 27):
                drop = {22: {1, 2}, 23: {3}, 24: {4}, 27: {7}}[c]
                self.flags = self.flags - drop
            elif 30 <= c <= 37 or 90 <= c <= 97:
                self.fg = str(c)
            elif 40 <= c <= 47 or 100 <= c <= 107:
                self.bg = str(c)
            elif c == 39:
                self.fg = None
            elif c == 49:
                self.bg = None
            elif c in (38, 48) and i + 1 < len(codes):  # 256-colour or RGB
                n = 3 if codes[i + 1] == 5 else 5
                value = ";".join(map(str, codes[i:i + n]))
                if c == 38:
                    self.fg = value
                else:
                    self.bg = value
                i += n - 1
            i += 1

    def code(self) -> str:
        """Canonical SGR parameters ('' for the default style)."""
        parts = [str(f) for f in sorted(self.flags)]
        parts += [x for x in (self.fg, self.bg) if x]
        return ";".join(parts)


@functools.lru_cache(maxsize=4096)
def _after(code: str, params: str) -> str:
    """The style code after an SGR sequence with ``params`` is applied to style ``code``."""
    style = _Style()
    if code:
        style.apply(code)
    style.apply(params)
    return style.code()


class Terminal:
    """One stream (a rank's stdout or stderr): feed bytes, get the lines it finished."""

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._style = ""         # the current SGR style code ('' = default)
        self._carry = ""
        self._plain = ""          # fast representation of the line while it has no styles
        self._segs: list | None = None   # (style, text) segments once styled or rewritten
        self._col = self._len = 0  # cursor column and line length (in segment mode)
        self._dropped = 0
        self.rewrites = 0         # times a \r rewrote a non-empty line (progress bars)
        self._rewritten = False   # the current line was rewritten (it is a progress line)
        self._last_progress = ""
        self.changed = False      # the pending line changed since the caller last cleared this

    # ----------------------------------------------------------------- input
    def feed(self, data: bytes) -> list[str]:
        text = self._carry + self._decoder.decode(data)
        self._carry = ""
        if "\x1b" in text:
            m = _INCOMPLETE.search(text, max(0, len(text) - _CARRY_MAX))
            if m:
                self._carry, text = text[m.start():], text[:m.start()]
        if not text:
            return []
        self.changed = True
        if self._segs is None and not self._style and not _special(text):
            return self._feed_plain(text)
        return self._feed_tokens(text)

    def flush(self) -> list[str]:
        """The stream ended: its unfinished line (if any) as a last line."""
        rest = self._carry + self._decoder.decode(b"", final=True)
        self._carry = ""
        out = self._feed_tokens(rest) if rest else []
        if self._plain or self._segs or self._dropped:
            out.append(self._finish())
        return out

    @property
    def has_pending(self) -> bool:
        """Is a line being written? (Cheap: ``pending`` builds the line.)"""
        return bool(self._plain or self._segs or self._dropped)

    @property
    def pending(self) -> str:
        """The line being written (no newline yet), as it looks now; '' if none."""
        if self._segs is not None:
            return _render(self._segs) + self._more(self._dropped)
        return self._plain + self._more(self._dropped)

    @property
    def progress(self) -> str:
        """The stream's latest progress line (one rewritten by \\r), plain text; '' if none."""
        return plain(self.pending) if self._rewritten else self._last_progress

    # ----------------------------------------------------------- internals
    def _more(self, dropped: int) -> str:
        return f" … [{dropped} more characters]" if dropped else ""

    def _feed_plain(self, text: str) -> list[str]:
        if "\n" not in text:
            self._append_plain(text)
            return []
        pieces = text.split("\n")
        self._append_plain(pieces[0])
        out = [self._finish()]
        limit = self.limit
        for p in pieces[1:-1]:
            out.append(p if len(p) <= limit else p[:limit] + self._more(len(p) - limit))
        self._append_plain(pieces[-1])
        return out

    def _append_plain(self, text: str) -> None:
        room = self.limit - len(self._plain)
        if room >= len(text):
            self._plain += text
        else:
            if room > 0:
                self._plain += text[:room]
            self._dropped += len(text) - max(room, 0)

    def _finish(self) -> str:
        line = (_render(self._segs) if self._segs is not None else self._plain) + self._more(self._dropped)
        if self._rewritten:
            self._last_progress, self._rewritten = plain(line), False
        self._plain, self._segs, self._col, self._len, self._dropped = "", None, 0, 0, 0
        return line

    def _to_segs(self) -> list:
        if self._segs is None:
            self._segs = [("", self._plain)] if self._plain else []
            self._col = self._len = len(self._plain)
            self._plain = ""
        return self._segs

    def _write(self, style: str, run: str) -> None:
        segs, col = self._to_segs(), self._col
        room = self.limit - col
        if room < len(run):
            self._dropped += len(run) - max(room, 0)
            run = run[:max(room, 0)]
            if not run:
                return
        end = col + len(run)
        if col == self._len:                     # appending: the common case
            if segs and segs[-1][0] == style:
                segs[-1] = (style, segs[-1][1] + run)
            else:
                segs.append((style, run))
        else:                                    # overwriting after \r or \b
            self._segs = _cut(segs, 0, col) + [(style, run)] + _cut(segs, end, self._len)
        self._col, self._len = end, max(self._len, end)

    def _feed_tokens(self, text: str) -> list[str]:
        out = []
        for m in _TOKEN.finditer(text):
            run = m.group(6)
            if run is not None:
                if self._segs is None and not self._style:
                    self._append_plain(run)
                else:
                    self._write(self._style, run)
            elif m.group(4) is not None:          # \n
                out.append(self._finish())
            elif m.group(3) is not None:          # \r
                self._to_segs()
                if self._len:
                    self.rewrites += 1
                    self._rewritten = True
                self._col, self._dropped = 0, 0
            elif m.group(5) is not None:          # \b
                self._to_segs()
                self._col = max(0, self._col - 1)
            elif m.group(2) == "m":               # SGR
                self._style = _after(self._style, m.group(1))
            elif m.group(2) == "K":               # erase in line
                segs, col = self._to_segs(), self._col
                mode = m.group(1) or "0"
                if mode == "0":
                    self._segs, self._len = _cut(segs, 0, col), col
                elif mode == "2":
                    self._segs, self._len = ([("", " " * col)] if col else []), col
                elif mode == "1":
                    self._segs = ([("", " " * col)] if col else []) + _cut(segs, col, self._len)
            # any other escape (cursor movement, OSC titles, ...) is dropped
        return out


def _special(text: str) -> bool:
    return "\r" in text or "\x1b" in text or "\x08" in text   # (faster than a regex here)


def _cut(segs: list, start: int, end: int) -> list:
    """The part of a segment list between columns start and end."""
    out, pos = [], 0
    for style, text in segs:
        a, b = pos, pos + len(text)
        pos = b
        if b <= start or a >= end:
            continue
        out.append((style, text[max(start, a) - a:min(end, b) - a]))
    return out


def _render(segs: list) -> str:
    """(style, text) segments → one string with a canonical SGR prefix per styled run."""
    parts, current = [], ""
    for style, text in segs:
        if style != current:
            parts.append(f"\x1b[0;{style}m" if style else "\x1b[0m")
            current = style
        parts.append(text)
    if current:
        parts.append("\x1b[0m")
    return "".join(parts)


def plain(line: str) -> str:
    """The line's text without its styling."""
    return _SGR_RE.sub("", line) if "\x1b" in line else line


def _css(code: str) -> str:
    style = _Style()
    style.apply(code)
    css = []
    fg, bg = _color(style.fg), _color(style.bg)
    if 7 in style.flags:
        fg, bg = bg or "#fff", fg or "#000"
    if fg:
        css.append(f"color:{fg}")
    if bg:
        css.append(f"background:{bg}")
    if 1 in style.flags:
        css.append("font-weight:bold")
    if 2 in style.flags:
        css.append("opacity:.7")
    if 3 in style.flags:
        css.append("font-style:italic")
    if 4 in style.flags:
        css.append("text-decoration:underline")
    return ";".join(css)


def _hex(rgb) -> str:
    r, g, b = rgb
    return f"#{r:02x}{g:02x}{b:02x}"


def _color(code: str | None) -> str | None:
    if not code:
        return None
    parts = [int(p) for p in code.split(";")]
    c = parts[0]
    if 30 <= c <= 37 or 40 <= c <= 47:
        return _COLORS[c % 10]
    if 90 <= c <= 97 or 100 <= c <= 107:
        return _BRIGHT[c % 10]
    if len(parts) >= 3 and parts[1] == 5:
        n = parts[2]
        if n < 8:
            return _COLORS[n]
        if n < 16:
            return _BRIGHT[n - 8]
        if n < 232:
            n -= 16
            r, g, b = (n // 36) % 6, (n // 6) % 6, n % 6
            return _hex(0 if v == 0 else 55 + 40 * v for v in (r, g, b))
        v = 8 + 10 * (n - 232)
        return _hex((v, v, v))
    if len(parts) >= 5 and parts[1] == 2:
        return _hex(max(0, min(255, v)) for v in parts[2:5])
    return None


def to_html(line: str) -> str:
    """The line as HTML: escaped text, each styled run in a ``<span style=...>``."""
    if "\x1b" not in line:
        return html.escape(line, quote=False)
    out, pos, open_span = [], 0, False
    for m in _SGR_RE.finditer(line):
        out.append(html.escape(line[pos:m.start()], quote=False))
        pos = m.end()
        if open_span:
            out.append("</span>")
            open_span = False
        css = _css(m.group(1))
        if css:
            out.append(f'<span style="{css}">')
            open_span = True
    out.append(html.escape(line[pos:], quote=False))
    if open_span:
        out.append("</span>")
    return "".join(out)
