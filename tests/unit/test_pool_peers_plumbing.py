"""benchmarks/pool_peers.py counts an all_reduce cell only when every rank's line arrived: each
peer shows its ranks' output in its own form (nbddp's text view merges equal lines, ipyparallel
sends a display per engine, jupyter-distributed one display of ``[Rank N — ok]`` sections), and a
cell that lost a rank's line must not be timed as a success."""
import importlib.util
import os
import sys

import pytest

import support
from support.kernel import Reply

BENCH = os.path.join(str(support.ROOT), "benchmarks")
sys.path.insert(0, BENCH)  # pool_peers imports bench.py as a top-level module, as when it runs
spec = importlib.util.spec_from_file_location("pool_peers", os.path.join(BENCH, "pool_peers.py"))
pool_peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pool_peers)

EXPECT = r"SUM 2.0 RANK (\d+)"
JD = "application/vnd.jupyter-distributed.rank+json"

REPLIES = {  # what each peer's 2-rank all_reduce cell sent (shapes as the real kernels send them)
    "nbddp text view": Reply(stdout="nbddp: 2 ranks (1 node × 2), backend gloo\n[rank0]:SUM 2.0 RANK 0\n"
                                    "[rank1]:SUM 2.0 RANK 1\n"),
    "ipyparallel": Reply(outputs=[{"data": {"text/plain": "[stdout:0] SUM 2.0 RANK 0\n"}},
                                  {"data": {"text/plain": "[stdout:1] SUM 2.0 RANK 1\n"}}]),
    "jupyter-distributed": Reply(outputs=[{"data": {JD: {}, "text/plain": "[Rank 0 — ok]\nSUM 2.0 RANK 0\n\n"
                                                                          "[Rank 1 — ok]\nSUM 2.0 RANK 1"}}]),
}


class Fake:
    def __init__(self, reply):
        self.reply = reply

    def execute(self, code, timeout):
        self.reply.status = "ok"
        return self.reply


@pytest.mark.parametrize("peer", REPLIES)
def test_a_cell_counts_when_every_rank_answered(peer):
    run = pool_peers.PeerRun(peer, Fake(REPLIES[peer]), lambda code: code)
    run.cell("", 2, EXPECT)()


@pytest.mark.parametrize("peer", REPLIES)
def test_a_cell_that_lost_a_rank_fails(peer):
    run = pool_peers.PeerRun(peer, Fake(REPLIES[peer]), lambda code: code)
    with pytest.raises(RuntimeError, match=r"from ranks \[0, 1\], not all 3"):
        run.cell("", 3, EXPECT)()  # a third rank was expected
