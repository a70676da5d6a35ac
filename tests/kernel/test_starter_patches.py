"""In a fresh interpreter: importing nbddp and its forkserver starter adjusts nothing of multiprocess;
the first context made does. (What the starter is and holds, read from its source:
tests/unit/test_starter.py.)"""
from __future__ import annotations

import subprocess
import sys
import textwrap


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
