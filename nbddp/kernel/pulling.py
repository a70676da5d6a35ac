"""``--pull``: the ranks' values become notebook names only when every rank that was asked sent
one. A name a rank lacks, or a value it could not send back, raises PullError naming the
ranks, and the notebook's value is left as it was (pure logic on the RunResult)."""
from __future__ import annotations

from nbddp.core.diagnosis import NOT_TARGETED
from nbddp.core.result import DDPError
from nbddp.core.summary import label


class PullError(DDPError):
    """A ``--pull`` name was missing (or could not be sent) on a rank that was asked for it."""

    def __init__(self, result, problem: str):
        self.problem = problem
        super().__init__(result)

    def _headline(self) -> str:
        return self.problem


def collect(items, result) -> dict:
    """{name: value} for the notebook from ``--pull`` items (``x``: a list indexed by rank, where
    a rank the cell did not run on gives None; ``x@0``: rank 0's value)."""
    values, problems = {}, []
    for item in items:
        name, _, rank = item.partition("@")
        if rank:
            asked = [result.ranks[int(rank)]]
        else:
            asked = [r for r in result.ranks if r.cause != NOT_TARGETED]
        idle = [r.rank for r in asked if r.cause == NOT_TARGETED]  # x@1 on a pool --ranks 0 cell
        if idle:
            problems.append(f"rank {idle[0]} did not run this cell")
            continue
        missing = [r.rank for r in asked if name not in r.pulled and name not in r.pull_errors]
        unsent = [r for r in asked if name in r.pull_errors]
        if missing:
            problems.append(f"{label(missing)} {'have' if len(missing) > 1 else 'has'} "
                            f"no name {name!r} after the cell")
        for r in unsent:
            problems.append(f"rank {r.rank} could not send {name!r} back: {r.pull_errors[name]}")
        if not missing and not unsent:
            values[name] = asked[0].pulled[name] if rank else [r.pulled.get(name) for r in result.ranks]
    if problems:
        raise PullError(result, f"--pull {','.join(items)}: " + "; ".join(problems)
                        + " (the notebook's values were left as they were)")
    return values
