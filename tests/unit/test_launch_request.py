"""How a launch is asked for, as a newcomer should find it (#38): the LaunchSpec data, the
%%ddp options and their rules, and the line commands each in a module of its own; one Launch
request that every process source takes; the per-cell files and the RunResult made in one place;
the public Pool above the API. Read from the code itself (ast), without a kernel."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import support

ROOT = support.ROOT / "nbddp"


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
    from nbddp.core import ddpline, launchrules, linecommands, spec

    assert "extra" not in {f.name for f in dataclasses.fields(spec.LaunchSpec)}  # nothing read it
    assert not any(name.startswith("nbddp") and name != "nbddp.core.spec"
                   for name in _imports(ROOT / "core" / "spec.py"))  # data: imports nothing of nbddp
    assert "argparse" not in (ROOT / "core" / "spec.py").read_text()
    assert callable(ddpline.parse_line) and callable(launchrules.choose_source)
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
    assert set(api.SOURCES) == {"local", "pool", "torchrun", "slurm", "ray"}
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


def test_the_cell_files_and_the_result_are_made_in_one_place_and_the_pool_sits_above_the_api():
    import nbddp
    from nbddp import pool
    from nbddp.sources import pool as pool_source

    users = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                   if "cellscript.create(" in p.read_text() or "pushing.pack(" in p.read_text())
    # one context manager for a launch's and a pool cell's files; torchrun's agent writes its own script
    assert users == ["kernel/cellfiles.py", "sources/torchrun.py"], users
    builders = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                      if _calls(p, "result.RunResult") + p.read_text().count(" RunResult(") > 0)
    assert builders == ["core/result.py"], builders  # launch_result(), for every source
    # the public Pool is above the API; the pool's source imports nothing of it (no loop)
    assert nbddp.Pool is pool.Pool and issubclass(pool.Pool, pool_source.LivePool)
    assert "nbddp.api" not in _imports(ROOT / "sources" / "pool.py")
    # the pool's state (IDLE/BUSY/BROKEN/STOPPED, why it broke) is written by one class
    tree = ast.parse((ROOT / "sources" / "pool.py").read_text())
    writers = {cls.name for cls in tree.body if isinstance(cls, ast.ClassDef)
               for node in ast.walk(cls) if isinstance(node, (ast.Assign, ast.AugAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               for t in ast.walk(target) if isinstance(t, ast.Attribute) and t.attr in ("state", "why_broken")
               and ast.unparse(t.value) in ("self", "self.pool")}  # not a rank's result.state
    assert writers == {"LivePool"}, writers
