"""``nbddp.Pool``: persistent ranks that keep their model, optimizer and process group between
cells (``%ddp_pool``'s, and Python's). Above the API: a cell goes through ``nbddp.run`` like any
other (every rule checked, the sinks chosen), which hands it to the pool's source
(nbddp/sources/pool.py, where the ranks and the pool's state live)."""
from __future__ import annotations

from nbddp import api
from nbddp.core import rankdiff
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import check_pool_spec, given_or_made
from nbddp.core.linecommands import parse_diff_line
from nbddp.core.result import RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.core.summary import label
from nbddp.kernel import diffing
from nbddp.sources.pool import LivePool


class Pool(LivePool):
    """``Pool(n=4).start()``, then ``pool.run(source)`` as often as needed, then ``stop()``.
    Options as ``nbddp.run``'s (or a whole ``spec``); a pool is nbddp's own ranks, so another
    ``launcher`` is refused (DDPUsageError)."""

    def __init__(self, spec: LaunchSpec | None = None, *, cwd: str | None = None,
                 base_env: dict | None = None, **options):
        spec = given_or_made(spec, options.pop("n", None), options)
        check_pool_spec(spec)
        super().__init__(spec, cwd=cwd, base_env=base_env)

    def run(self, source: str, *, ranks=None, timeout: float | None = None, push: dict | None = None,
            pull=(), sinks=None, check: bool = True, cell_label: str | None = None) -> RunResult:
        """Run ``source`` on ``ranks`` (default all) of the live pool; returns this cell's RunResult.
        ``pull``: names each rank sends back (``result.ranks[i].pulled``); ``sinks`` as for
        ``nbddp.run`` (default: text); ``cell_label`` names the cell in tracebacks and stacks
        ("Cell In[3]"). The same entry as ``nbddp.run(source, pool=pool, ...)``."""
        return api.run(source, pool=self, ranks_shown=ranks, timeout=timeout, push=push, pull=pull,
                       sinks=sinks, check=check, cell_label=cell_label)

    def diff(self, *names: str, who: str = "%ddp_diff") -> str:
        """Compare ``names`` (modules, optimizers, tensors, dicts/lists of them, ``"rng"``) across
        the ranks by hash; the report names the first entries that differ, on which ranks, with
        the max abs difference. A name some rank lacks: DDPUsageError."""
        if not names or not all(isinstance(n, str) for n in names):
            raise DDPUsageError(f"{who}: name what to compare, e.g. {who} model opt rng")
        names = parse_diff_line(" ".join(names), running=True) or names  # each a name or attribute path
        if not self.ready:
            raise DDPUsageError(f"{who}: the pool is not running cells ({self.why_broken or self.state}); "
                                "%ddp_pool restart, or --diff NAME on a %%ddp --fresh cell")
        folder = diffing.new_folder()
        try:
            result = api.run(diffing.snippet(names, folder), pool=self, sinks=[], check=False,
                             timeout=2 * rankdiff.WAIT + 60)
            failed = [r for r in result.ranks if not r.ok]
            if failed:
                raise DDPUsageError(f"{who}: {label([r.rank for r in failed])} failed to compare: "
                                    f"{failed[0].cause}")
            return diffing.collect(folder, self.spec.world_size, who, strict=True)
        finally:
            diffing.done(folder)
