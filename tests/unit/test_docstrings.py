"""The package's docstrings say what and why, in a few lines: measurements and history live in the
docs (docs/explanation/performance.md, reliability.md) and the benchmark results, where a reader
looks for them and where their context (machine, date, how often) can be kept with them.

Read from the source (ast for docstrings, tokenize for comments): every module of nbddp has a
docstring of at most MAX_LINES lines (a few modules that state a contract, longer, each named
with its reason), and no docstring or comment carries a measurement (a number with ms/KB/MB/GB,
"measured"), an issue number, a date or a CI anecdote.
"""
from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import nbddp

ROOT = pathlib.Path(nbddp.__file__).parent

MAX_LINES = 8

# Modules whose docstring states a contract other modules, the tests or the docs hold it to.
CONTRACTS = {
    "core/rankfiles.py": 13,         # the per-rank files' names: a table kernel, ranks, tests and docs share
    "core/sink.py": 11,              # the events a sink gets and their order: what a user's own sink relies on
    "sources/torchrun_ranks.py": 11,  # the status-file protocol torchrun_rank.py writes and this module reads
}

MEASUREMENT = re.compile(r"\d[\d,.]*\s*(?:ms|[KMGT]i?B)\b|\bmeasured\b", re.I)
HISTORY = re.compile(r"\bissue\s*#?\d|(?<![\w&])#\d+(?:\.\d+)?\b|\b20\d\d-\d\d-\d\d\b|\bCI\b")

# (module, text it may carry): a constant whose docstring or comment must name a unit. None today:
# every constant's unit is said in its name (``_S``, ``_MIB``, ``_BYTES``) or in words.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def _texts(source: str):
    """(line, text) of every docstring (module, class, function) and every comment."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _offending(pattern: re.Pattern) -> list[str]:
    found = []
    for name, source in _modules().items():
        for line, text in _texts(source):
            for match in pattern.finditer(text):
                if (name, match.group(0)) not in ALLOWED:
                    found.append(f"nbddp/{name}:{line}: {match.group(0)!r}")
    return found


def test_every_module_has_a_short_docstring():
    too_long, missing = [], []
    for name, source in _modules().items():
        doc = ast.get_docstring(ast.parse(source), clean=False)
        if not doc or not doc.strip():
            missing.append(name)
            continue
        lines = len(doc.strip().splitlines())
        if lines > CONTRACTS.get(name, MAX_LINES):
            too_long.append(f"nbddp/{name}: {lines} lines")
    assert not missing, f"modules without a docstring (say what the module does and why): {missing}"
    assert not too_long, (f"module docstrings over {MAX_LINES} lines (what and why in a few lines; "
                          f"the details to the docs): {too_long}")


def test_no_docstring_or_comment_carries_a_measurement():
    found = _offending(MEASUREMENT)
    assert not found, ("measurements belong in docs/explanation/performance.md or the benchmark "
                       f"results, with their context: {found}")


def test_no_docstring_or_comment_narrates_history():
    found = _offending(HISTORY)
    assert not found, f"issue numbers, dates and CI stories belong in CHANGELOG.md or the docs: {found}"


def test_the_contract_list_names_modules_that_exist_and_need_it():
    modules = _modules()
    for name, limit in CONTRACTS.items():
        assert name in modules, f"CONTRACTS names nbddp/{name}, which is gone"
        lines = len(ast.get_docstring(ast.parse(modules[name]), clean=False).strip().splitlines())
        assert MAX_LINES < lines <= limit, f"nbddp/{name}: {lines} lines, listed for {limit}: update CONTRACTS"


def test_the_patterns_catch_what_they_are_for():
    assert MEASUREMENT.search("forking costs ~5 ms a rank") and MEASUREMENT.search("12.6 measured")
    assert MEASUREMENT.search("a kernel with torch is ~250 MB") and MEASUREMENT.search("64 KiB")
    assert not MEASUREMENT.search("TAIL_BYTES: the last bytes of a log") and not MEASUREMENT.search("every 0.1 s")
    assert HISTORY.search("(issue #37.1)") and HISTORY.search("in a CI run") and HISTORY.search("2026-12-05")
    assert not HISTORY.search('"#1a4d8f"  # a colour') and not HISTORY.search("&#9888;")
