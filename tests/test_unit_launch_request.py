"""How a launch is asked for, as a newcomer should find it (#38): the LaunchSpec data, the
%%ddp options and their rules, and the line commands each in a module of its own; one Launch
request that every process source takes; the per-cell files and the RunResult made in one place;
the public Pool above the API. Read from the code itself (ast), without a kernel."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "nbddp"


def _imports(path: Path) -> set[str]:
    """Every nbddp module a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.startswith("nbddp")}


def test_the_spec_is_data_and_its_parser_rules_and_line_commands_live_apart():
    from nbddp.core import launchrules, linecommands, spec

    assert "extra" not in {f.name for f in dataclasses.fields(spec.LaunchSpec)}  # nothing read it
    assert not any(name.startswith("nbddp") and name != "nbddp.core.spec"
                   for name in _imports(ROOT / "core" / "spec.py"))  # data: imports nothing of nbddp
    assert "argparse" not in (ROOT / "core" / "spec.py").read_text()
    assert callable(launchrules.parse_line) and callable(launchrules.choose_source)
    assert callable(linecommands.parse_pool_line) and callable(linecommands.parse_export_line)
    assert not hasattr(launchrules, "parse_pool_line")
