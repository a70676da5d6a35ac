"""The forkserver's starter (nbddp/forkserver/starter.py) manages the forkserver only: what the
notebook shows while one imports torch is given to it by the extension (nbddp/views/startnote.py),
and it patches nothing at import. (multiprocess adjusted by the first context only, in a fresh
interpreter: tests/kernel/test_starter_patches.py.)"""
from __future__ import annotations

import ast
import inspect

from nbddp.forkserver import starter


def test_the_starter_knows_nothing_of_notebooks():
    source = inspect.getsource(starter)
    assert "IPython" not in source and "display" not in source
    assert not any(hasattr(starter, name) for name in ("show_status", "clear_status", "wait_for_torch"))


def test_the_starter_patches_nothing_at_import():
    tree = ast.parse(inspect.getsource(starter))
    patched = [ast.unparse(target) for node in tree.body if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Attribute)]
    assert patched == []
