"""The notebook kernel's own memory after ``%load_ext nbddp`` and one ``%%ddp -n 4`` cell: RSS
and PSS of the kernel process (not its forkserver or ranks), and whether it imported torch.
nbddp's kernel side is meant to be stdlib-only: the stores and the device count are answered by
a process of the forkserver's (nbddp/forkserver/storehost.py). Also the first cell's first line,
so a lighter kernel is seen not to be a slower one.

    .venv/bin/python benchmarks/kernel_memory.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

CELL = "%%ddp -n {n} --output text\nprint('first line', flush=True)"
PROBE = "import sys, json; print(json.dumps({'torch': 'torch' in sys.modules}))"


def _memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB from /proc/PID/smaps_rollup."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                values[parts[0]] = int(parts[1]) / 1024
    return values["Rss:"], values["Pss:"]


def once(n: int) -> dict:
    k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-kernel-memory-"))
    try:
        k.ok("%load_ext nbddp")
        t0 = time.monotonic()
        reply = k.ok(CELL.format(n=n), timeout=300)
        cell_s = time.monotonic() - t0
        if "first line" not in reply.text:
            raise RuntimeError(f"the cell did not run: {reply.text[-500:]}")
        probe = json.loads(k.ok(PROBE).text.strip().splitlines()[-1])
        rss, pss = _memory_mb(k.pid)
        return {"rss_mb": rss, "pss_mb": pss, "torch": probe["torch"], "cell_s": cell_s}
    finally:
        k.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = [once(args.ranks) for _ in range(args.repeats)]
    med = {key: statistics.median(r[key] for r in runs) for key in ("rss_mb", "pss_mb", "cell_s")}
    torch_in = sorted({r["torch"] for r in runs})
    print(f"Kernel after %load_ext nbddp and a -n {args.ranks} cell, median of {len(runs)}: "
          f"RSS {med['rss_mb']:.0f} MB, PSS {med['pss_mb']:.0f} MB, torch in sys.modules: "
          f"{'/'.join(map(str, torch_in))}, first cell {med['cell_s']:.2f} s")


if __name__ == "__main__":
    main()
