"""The forkserver's starter (nbddp/forkserver/starter.py) manages the forkserver only: what the
notebook shows while one imports torch is given to it by the extension (nbddp/views/startnote.py),
and multiprocess is adjusted when the first context is made, not on import."""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap

import pytest

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


@pytest.mark.kernel
def test_multiprocess_is_adjusted_by_the_first_context_only():
    code = textwrap.dedent("""
        from multiprocess import spawn, util
        before = (util.spawnv_passfds, spawn.get_preparation_data, util._flush_std_streams)
        import nbddp
        from nbddp.forkserver import starter
        assert (util.spawnv_passfds, spawn.get_preparation_data, util._flush_std_streams) == before
        starter.context("spawn")
        assert util.spawnv_passfds is starter._spawnv_passfds_in_own_session
        assert spawn.get_preparation_data is starter._preparation_without_main
        assert util._flush_std_streams is starter._flush_unless_starting
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
