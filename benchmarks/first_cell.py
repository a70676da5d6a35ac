"""The first %%ddp cell after %load_ext nbddp, in a new kernel, sent the moment %load_ext has
answered (as "Run all" does): seconds from execute until the cell shows anything (nbddp's status
while torch is still being imported), until a rank's first line, and until the cell ends.
Later cells take 0.1-0.3 s (bench.py); this one pays for importing torch once.

    .venv/bin/python benchmarks/first_cell.py --ranks 4 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

MARK = "first line"
CELL = "%%ddp -n {n} --output text\nprint('" + MARK + "', flush=True)"


def _visible(msg) -> bool:
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        return bool(content["text"].strip())
    if kind in ("display_data", "update_display_data", "execute_result"):
        return bool(str(content["data"].get("text/plain", "")).strip())
    return False


def once(n: int) -> dict:
    """One new kernel: {"shown": s, "first": s, "end": s} for its first %%ddp cell."""
    k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-first-cell-"))
    try:
        t_load = time.monotonic()
        k.ok("%load_ext nbddp")
        t0 = time.monotonic()
        msg_id = k.kc.execute(CELL.format(n=n))
        times, text = {}, ""
        while "end" not in times:
            if time.monotonic() - t0 > 300:
                raise TimeoutError(f"first cell did not end in 300 s: {text[-500:]}")
            try:
                msg = k.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            now = time.monotonic() - t0
            if _visible(msg):
                times.setdefault("shown", now)
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
                if MARK in text:
                    times.setdefault("first", now)
                    times.setdefault("from_load", now + t0 - t_load)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                times["end"] = now
        return times
    finally:
        k.shutdown()


def measure(n: int = 4, repeats: int = 3) -> dict:
    """{"shown": [s, ...], "first": [...], "end": [...]} over ``repeats`` new kernels."""
    runs = [once(n) for _ in range(repeats)]
    return {key: [r[key] for r in runs if key in r] for key in ("shown", "first", "end", "from_load")}


def summary(times: dict, n: int) -> str:
    def med(key):
        values = times.get(key) or []
        return (f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"
                if values else "never")
    return (f"First %%ddp cell after %load_ext, {n} ranks, new kernel, median (min–max) of "
            f"{len(times.get('end', []))}: something shown {med('shown')}, a rank's first line "
            f"{med('first')} ({med('from_load')} from %load_ext's execute), cell done {med('end')}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(summary(measure(a.ranks, a.repeats), a.ranks))


if __name__ == "__main__":
    main()
