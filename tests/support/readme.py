"""The README's fenced ``bash`` blocks and how tests/kernel/test_readme.py treats each: run here,
line by line, or named with the reason it cannot run on a test machine."""
from __future__ import annotations

import os
import re
import textwrap

from support import ROOT

README = os.path.join(ROOT, "README.md")

# How each block is treated, by its first line: None runs it, a string says why it cannot run here.
BLOCKS = {
    "bash scripts/demo.sh": None,
    "pip install torch --index-url https://download.pytorch.org/whl/cpu":
        None,  # both lines: torch 2.13.0 is already in .venv (setup-venv.sh put it), so pip says so
    'pip install -e ".[lessons]"': None,
}
# Lines of a run block that cannot run here, by their first words, and why.
LINES = {
    "bash scripts/test.sh": "it runs this whole suite (a test cannot run the suite it is part of) and, as root, "
                            "installs Debian packages and starts Slurm; CI runs it on a clean clone",
}
SERVER = "jupyter lab"  # a line that starts a server: started, asked over HTTP, stopped


def bash_blocks(markdown: str) -> list[list[str]]:
    """The lines of each fenced ``bash`` block (indented ones too), without the indentation."""
    blocks = re.findall(r"^([ \t]*)```bash\n(.*?)^\1```", markdown, flags=re.M | re.S)
    return [textwrap.dedent(body).splitlines() for _, body in blocks]


def command_and_comment(line: str) -> tuple[str, str]:
    """``pip install x   # why`` -> (``pip install x``, ``why``); ``#SBATCH …`` is all command."""
    match = re.match(r"(.*?)\s+#\s(.*)$", line)
    return (match.group(1).strip(), match.group(2).strip()) if match else (line.strip(), "")


def plan(block: list[str]) -> str | None:
    """None: run the block; else why it cannot run here. KeyError for a block nobody planned."""
    return BLOCKS[command_and_comment(block[0])[0]]


def readme_blocks() -> list[list[str]]:
    with open(README) as f:
        return bash_blocks(f.read())
