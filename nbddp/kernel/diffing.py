"""``%ddp_diff`` and ``--diff`` in the kernel: the private folder where the ranks meet
(nbddp/rank/diffing.py), the line the ranks run after the cell's code, and the report read from
what they left there (nbddp/core/rankdiff.py). The kernel reads hashes and a few numbers, never
the tensors."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from nbddp.core import rankdiff
from nbddp.core.errors import DDPUsageError
from nbddp.core.summary import label
from nbddp.kernel.janitor import remove_at_exit


def new_folder() -> str:
    """A fresh 0700 folder for one comparison (removed by ``done``, or with the kernel)."""
    path = tempfile.mkdtemp(prefix="nbddp-diff-")
    remove_at_exit(path)
    return path


def done(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def snippet(names, folder: str) -> str:
    """The code each rank runs (after the cell's own, for --diff); it leaves no name behind."""
    return (f"\n__import__('nbddp.rank.diffing', fromlist=['exchange']).exchange("
            f"globals(), {list(names)!r}, {folder!r})\n")


def collect(folder: str, world: int, who: str, strict: bool = False, failed=()) -> str:
    """The report from the ranks' files. A name some rank lacks (or cannot compare) is one line:
    a DDPUsageError where ``strict`` (``%ddp_diff``), else the report's line (``--diff``: the
    cell itself ran). ``failed``: the ranks whose cell failed (so never reached the comparison)."""
    summaries = {rank: _load(folder, f"summary-{rank}.json") for rank in range(world)}
    absent = [rank for rank, found in summaries.items() if found is None]
    if absent and failed:
        return f"{who}: not compared: the cell failed on {label(failed)} before its end"
    if absent:
        return f"{who}: not compared: {label(absent)} did not reach the comparison"
    problem = rankdiff.problems(summaries)  # type: ignore[arg-type]
    if problem:
        if strict:
            raise DDPUsageError(f"{who}: {problem}")
        return f"{who}: not compared: {problem}"
    computed = {rank: _load(folder, f"computed-{rank}.json") or {} for rank in range(world)}
    return rankdiff.report(rankdiff.compare(summaries), computed, who)  # type: ignore[arg-type]


def _load(folder: str, name: str) -> dict | None:
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
