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


def _calls(path: Path, dotted: str) -> int:
    """How many times a file calls ``dotted`` (e.g. "placement.plan")."""
    obj, attr = dotted.split(".")
    return sum(1 for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == attr and isinstance(node.func.value, ast.Name) and node.func.value.id == obj)


def test_one_launch_request_every_source_takes():
    import importlib
    import inspect

    from nbddp import api
    from nbddp.core import launchrules
    from nbddp.core.launch import Launch

    assert dataclasses.is_dataclass(Launch) and Launch.__dataclass_params__.frozen
    assert set(api.SOURCES) == {"local", "pool", "torchrun", "slurm"}
    for name, entry in api.SOURCES.items():  # {name: module.run}, one table
        module = importlib.import_module(f"nbddp.sources.{name}")
        assert entry is module.run, name
        assert list(inspect.signature(entry).parameters) == ["launch"], name
    assert not hasattr(launchrules, "SOURCES")  # no second list of the names
    assert not hasattr(api, "_Launch")  # one launch object, not one per layer
    assert getattr(importlib.import_module("nbddp.sources.local"), "Launch", Launch) is Launch
    # placed once per launch: by the source's entry (the pool: when it starts), not again by the API
    assert _calls(ROOT / "api.py", "placement.plan") == 0
    assert _calls(ROOT / "sources" / "forkranks.py", "placement.plan") == 0
    assert _calls(ROOT / "sources" / "local.py", "placement.plan") == 1
