"""The kernel's file descriptors stay bounded over any number of cells: a launch releases all
of its descriptors when it ends, and the next cell's forks do not pile up beside the spares
still being forked. Checked under a 256-descriptor soft limit, a quarter of the common 1024,
so a leak of even one descriptor a cell, or a peak that grows, fails it. 300 cells, as issue
#26 asks; with either fix of 5634f11 taken out (rank starts flushing ipykernel's streams from
their threads; a cell forking its ranks beside the spares being forked) a cell raised "Too many
open files" within the first 100 (2026-12-04), so the rest is margin for slower leaks."""
import json
import resource

import pytest

from kernel import Kernel

pytestmark = pytest.mark.kernel  # see tests/conftest.py

LIMIT = 256
CELLS = 300

LOOP = f"""import json, os
ip, counts = get_ipython(), []
for i in range({CELLS}):
    ip.run_cell_magic("ddp", "-n 8 --output text", "pass")
    counts.append(len(os.listdir("/proc/self/fd")))
print(json.dumps(counts))
"""


def test_300_cells_of_8_ranks_fit_in_256_descriptors(tmp_path):
    k = Kernel(cwd=str(tmp_path)).load_nbddp()
    try:
        hard = resource.prlimit(k.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(k.pid, resource.RLIMIT_NOFILE, (LIMIT, hard))
        # One execute request running the magic 300 times: the same launches as 300 cells,
        # without 300 round trips to this test (any "Too many open files" fails the cell).
        reply = k.ok(LOOP, timeout=900)
        counts = json.loads(reply.stdout.strip().splitlines()[-1])
        assert len(counts) == CELLS
        # nothing accumulates: the last cells hold what the first ones held (spares included)
        assert max(counts[-30:]) <= max(counts[:30]) + 8, (counts[:30], counts[-30:])
    finally:
        k.shutdown()
