"""``%ddp_pool start --all-cells`` in a real kernel: every cell of code runs on the pool's ranks
without a magic line, keeping their state; ``%%local``, other magics and ``!`` run in the
kernel; errors name the notebook's own line; the stop button stops the cell, not the pool; the
mode ends with ``all-cells off`` or the pool; papermill runs such a notebook as it is."""
import time

from support.helpers import alive, run_with_papermill, wait_gone

POOL_PIDS = ("%%local\nimport json; _pool = type(get_ipython().find_magic('ddp_pool').__self__).pool\n"
             "print('PIDS', json.dumps([r.result.pid for r in _pool.ranks]))")


def _pids(k):
    import json

    return json.loads(k.ok(POOL_PIDS).stdout.split("PIDS ", 1)[1])


def test_every_cell_runs_on_the_pool_until_it_is_turned_off(kernel):
    k = kernel
    said = k.ok("%ddp_pool start -n 2 --output text --all-cells").stdout
    assert "every cell now runs on the pool's ranks" in said
    pids = _pids(k)
    k.ok("import os\nrank = int(os.environ['RANK'])\nseen = [rank]")
    reply = k.ok("seen.append(rank * 10)\nprint('seen', seen)")
    assert "[rank0]:seen [0, 0]" in reply.stdout and "[rank1]:seen [1, 10]" in reply.stdout
    assert "kernel has RANK False" in k.ok("%%local\nimport os\nprint('kernel has RANK', 'RANK' in os.environ)").stdout
    assert "2 ranks" in k.ok("%ddp_pool status").stdout  # a line magic runs in the kernel
    assert "in the kernel again" in k.ok("%ddp_pool all-cells off").stdout
    assert "here False" in k.ok("import os\nprint('here', 'RANK' in os.environ)").stdout
    k.ok("%ddp_pool all-cells on")
    assert "[rank1]:still [1, 10]" in k.ok("print('still', seen)").stdout
    assert alive(pids) == pids
    said = k.ok("%ddp_pool stop").stdout
    assert "cells run in the kernel again" in said
    assert not wait_gone(pids, 10)
    assert "kernel again True" in k.ok("print('kernel again', 'seen' not in dir())").stdout


def test_a_failing_cell_names_the_notebooks_own_line(kernel):
    k = kernel
    k.ok("%ddp_pool start -n 2 --output text --all-cells")
    try:
        reply = k.execute("x = 1\nif int(__import__('os').environ['RANK']) == 1:\n    raise ValueError('on one rank')")
        assert reply.status == "error"
        assert "Cell In[" in reply.plain and ", line 3" in reply.plain, reply.plain
        assert "ValueError: on one rank" in reply.plain, reply.plain
        assert "rank 1: failed (ValueError: on one rank at cell line 3)" in "\n".join(reply.error["traceback"])
        assert "ok" in k.ok("print('ok')").stdout  # the pool serves the next cell
    finally:
        k.ok("%ddp_pool stop")


def test_the_stop_button_stops_an_all_cells_cell_and_keeps_the_pool(kernel):
    k = kernel
    k.ok("%ddp_pool start -n 2 --output text --all-cells")
    try:
        k.ok("counter = 41")
        pids = _pids(k)
        reply, pressed = k.interrupted_when("import time\nprint('looping', flush=True)\nwhile True:\n"
                                            "    time.sleep(0.01)", lambda r: r.stdout.count("looping") == 2)
        assert reply.error and reply.error["ename"] == "KeyboardInterrupt", reply
        assert time.monotonic() - pressed < 3.0
        assert alive(pids) == pids
        assert "[rank1]:42" in k.ok("counter += 1\nprint(counter)").stdout
    finally:
        k.ok("%ddp_pool stop")


def test_a_pool_stopped_from_python_ends_all_cells_in_one_line(kernel):
    k = kernel
    k.ok("%ddp_pool start -n 2 --output text --all-cells")
    k.ok("%%local\ntype(get_ipython().find_magic('ddp_pool').__self__).pool.stop()")
    reply = k.execute("print('where am I')")
    assert reply.status == "error" and reply.stderr.startswith("UsageError: %ddp_pool: the pool has stopped")
    assert "where am I" not in reply.stdout
    assert "where am I" in k.ok("print('where am I')").stdout  # all-cells is off now


def test_papermill_runs_an_all_cells_notebook(tmp_path):
    cells = ["%load_ext nbddp", "%ddp_pool start -n 2 --output text --all-cells",
             "import os\nrank = int(os.environ['RANK'])", "print('papermill rank', rank)", "%ddp_pool stop"]
    out, _ = run_with_papermill(cells, tmp_path)
    text = "".join(o.get("text", "") for o in out.cells[3].outputs)
    assert "papermill rank 0" in text and "papermill rank 1" in text, text
