"""Naming the cell in tracebacks and stacks as IPython does (``Cell In[3], line 7``), instead of
the per-launch script file the ranks ran (nbddp/kernel/cellscript.py), which is gone after the launch.
Pure text, imported by the ranks too (so nothing here may import torch)."""
from __future__ import annotations

import re


def cell_label(execution_count: int | None) -> str | None:
    """'Cell In[3]' for the notebook cell with that prompt number (None outside IPython)."""
    return None if execution_count is None else f"Cell In[{execution_count}]"


def log_label(log_copy: str) -> str:
    """How a launch that is not a numbered cell (``nbddp.run(source)``) names its frames: the
    copy of the source kept in the launch's log folder, as a traceback names any file."""
    return f'File "{log_copy}"'


def name_cell(text: str, script: str, label: str | None, source: str | None = None) -> str:
    """``text`` (a traceback, or faulthandler's stacks) with the frames of ``script`` named by
    ``label``. A traceback frame keeps the source line Python printed below it; a faulthandler
    frame (``line 7 in f``, no source) gets the cell's line from ``source`` below it, as a
    traceback would show it."""
    if not label or not script or not text:
        return text
    lines = source.splitlines() if source else []
    frame = re.compile(r'^(?P<indent>\s*)File "' + re.escape(script) + r'", line (?P<line>\d+)(?P<rest>.*)$')
    out = []
    for raw in text.splitlines(keepends=True):
        match = frame.match(raw.rstrip("\n"))
        if match is None:
            out.append(raw)
            continue
        indent, number, rest = match["indent"], int(match["line"]), match["rest"]
        out.append(f"{indent}{label}, line {number}{rest}\n")
        if rest.startswith(" in ") and 0 < number <= len(lines) and lines[number - 1].strip():
            out.append(f"{indent}    {lines[number - 1].strip()}\n")  # faulthandler's form: add the code
    joined = "".join(out)
    return joined if text.endswith("\n") else joined.rstrip("\n")


_SGR = r"(?:\x1b\[[0-9;]*m)*"


def name_cell_ipython(text: str, shown_path: str, label: str | None) -> str:
    """``text`` (a traceback IPython formatted, colours and all) with the frames of the file it
    shows as ``shown_path`` named by ``label``: as IPython names a cell (``File x.py:7`` becomes
    ``Cell In[3], line 7``), or the file a ``log_label`` names; the colours stay where they were."""
    if label and label.startswith("Cell "):
        word, name = "Cell", label[len("Cell "):]
    elif label and label.startswith('File "') and label.endswith('"'):
        word, name = "File", label[len('File "'):-1]
    else:
        return text
    frame = re.compile(r"(?P<pre>" + _SGR + r")File (?P<mid>" + _SGR + r")" + re.escape(shown_path) + r":(?P<line>\d+)")
    where = ", line {}" if word == "Cell" else ":{}"
    return frame.sub(lambda m: f"{m['pre']}{word} {m['mid']}{name}{where.format(m['line'])}", text)
