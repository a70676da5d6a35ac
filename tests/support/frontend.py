"""How a notebook front end renders stream messages, for tests: JupyterLab 4.6's (and Notebook
7's) own algorithm, ported from @jupyterlab/outputarea's ``processText`` as shipped in
.venv/share/jupyter/lab/static/jlab_core.*.js.

Consecutive stream messages of the same name are one output (their text combined, a cursor kept
between messages); a message of the other stream, or any other output, starts a new one. In an
output, text overwrites at the cursor; ``\\r`` moves the cursor to the start of its line, ``\\n``
appends a newline at the end and moves the cursor there, ``\\b`` deletes back. Lengths are
JavaScript's: UTF-16 code units, escape codes counted as the characters they are.
"""
from __future__ import annotations

import re

_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _units(text: str) -> list[str]:
    """The text as UTF-16 code units (each a 1-char str; a surrogate for half an emoji)."""
    data = text.encode("utf-16-le", "surrogatepass")
    return [data[i:i + 2].decode("utf-16-le", "surrogatepass") for i in range(0, len(data), 2)]


def _text(units: list[str]) -> str:
    return "".join(units).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def process_text(index: int, new: str, text: list[str]) -> int:
    """JupyterLab's processText on a list of UTF-16 units (changed in place); returns the cursor."""
    new_u = _units(new)
    r, o = index, 0
    while True:
        s = next((i for i in range(o, len(new_u)) if new_u[i] in "\n\b\r"), -1)
        piece = new_u[o:len(new_u) if s == -1 else s]
        text[r:r + len(piece)] = piece
        o, r = s + 1, r + len(piece)
        if s == -1:
            return r
        ch = new_u[s]
        if ch == "\b":
            if r > 0 and text[r - 1] != "\n":
                del text[r - 1:r + 1]
                r -= 1
        elif ch == "\r":
            while r > 0 and text[r - 1] != "\n":
                r -= 1
        else:
            text.append("\n")
            r = len(text)


def render(messages) -> list[tuple[str, str]]:
    """(stream name, text) messages in arrival order → the outputs JupyterLab shows, as
    (name, rendered text)."""
    outputs = []
    for name, new in messages:
        if not outputs or outputs[-1][0] != name:
            outputs.append([name, [], 0])
        out = outputs[-1]
        out[2] = process_text(out[2], new, out[1])
    return [(name, _text(units)) for name, units, _ in outputs]


def visible_lines(messages) -> list[str]:
    """Every line the user sees, in order, without colours and trailing blanks; empty lines dropped."""
    lines = []
    for _, text in render(messages):
        lines += [_SGR.sub("", line).rstrip() for line in text.split("\n")]
    return [line for line in lines if line]
