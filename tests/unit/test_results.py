"""What a launch's result says: the one rank-range phrase, the summary lines, the exit-state
rules every source shares (and torchrun's own), a torchrun launch's ranks read from real status
files, and DDPError/DDPTimeout's text. Pure: no kernel, no processes."""
import glob
import json
import signal
from pathlib import Path

import pytest

from nbddp.core import diagnosis, exitstates, summary
from nbddp.core.result import DDPError, DDPTimeout, RankResult, RunResult
from nbddp.core.states import LaunchState, PoolState, RankState, StopReason
from nbddp.sources.torchrun_ranks import TorchrunRanks


def rank(r, state=RankState.OK, cause="", **kw):
    return RankResult(rank=r, local_rank=r, node_rank=0, state=state, cause=cause, **kw)


def result(*ranks, **kw):
    return RunResult(ranks=list(ranks), world_size=kw.pop("world_size", len(ranks)), log_dir="/logs/7",
                     started_at=10.0, ended_at=12.5, **kw)


# ------------------------------------------------------------ the phrase
@pytest.mark.parametrize("ranks, phrase", [
    ([3], "rank 3"), ([0, 1, 2, 3], "ranks 0–3"), ([5, 0, 2, 1], "ranks 0–2,5"), ([1, 3], "ranks 1,3"),
    ((r for r in (7, 6)), "ranks 6–7"), ({4, 5, 6, 9, 10}, "ranks 4–6,9–10"),
])
def test_one_phrase_names_ranks(ranks, phrase):
    assert summary.label(ranks) == phrase


# ---------------------------------------------------------------- states
def test_states_are_their_words_in_text_and_json():
    assert RankState.TIMED_OUT == "timed out" and f"{RankState.TIMED_OUT}" == "timed out"
    assert str(RankState.OK) == "ok" and f"{RankState.OK:>4}" == "  ok"
    assert repr([(0, RankState.OK)]) == "[(0, 'ok')]" and "state='failed'" in repr(rank(1, RankState.FAILED))
    assert json.dumps({"state": RankState.FAILED}) == '{"state": "failed"}'
    assert RankState("terminated") is RankState.TERMINATED
    assert LaunchState.STOPPING == "stopping" and PoolState.IDLE == "ready" and StopReason.TIMEOUT == "timeout"
    assert rank(0, "failed").describe() == rank(0, RankState.FAILED).describe() == "rank 0: failed"


# --------------------------------------------------------------- summary
def test_summary_says_the_failed_rank_then_the_rest_once():
    res = result(rank(0, RankState.TERMINATED, "stopped by nbddp after rank 1 failed"),
                 rank(1, RankState.FAILED, "ValueError: boom at cell line 2"),
                 rank(2, RankState.TERMINATED, "stopped by nbddp after rank 1 failed"),
                 rank(3, RankState.TERMINATED, "stopped by nbddp after rank 1 failed"),
                 rank(4), rank(5))
    assert res.summary().splitlines() == [
        "rank 1: failed (ValueError: boom at cell line 2)",
        "ranks 0,2–3: terminated (stopped by nbddp after rank 1 failed)",
        "ranks 4–5 finished ok"]


def test_summary_of_a_good_launch_and_of_one_node_of_a_job():
    assert result(rank(0), rank(1)).summary() == "all 2 ranks finished ok in 2.50 s"
    assert result(rank(0), rank(1), world_size=4).summary() == (
        "all 2 ranks on this node (of 4 in the job) finished ok in 2.50 s")


def test_causing_ranks_keep_a_line_each_and_state_lines_can_include_ok():
    ranks = [rank(0, RankState.FAILED, "exited with code 1"), rank(1, RankState.FAILED, "exited with code 1"),
             rank(2)]
    assert summary.state_lines(ranks) == ["rank 0: failed (exited with code 1)", "rank 1: failed (exited with code 1)"]
    assert summary.state_lines(ranks, include_ok=True)[-1] == "rank 2: ok"


# ---------------------------------------------------------------- errors
def test_ddperror_names_failed_ranks_with_the_same_phrase():
    res = result(*(rank(r, RankState.FAILED, "exited with code 1") for r in range(4)), rank(4))
    err = DDPError(res)
    assert str(err).splitlines()[0] == "ranks 0–3 failed"
    assert "rank 4 finished ok" in str(err)
    assert err._render_traceback_()[-1] == "(full per-rank logs: /logs/7; the result is in _ddp)"


def test_ddperror_shows_a_traceback_once_and_points_at_shown_ones():
    tb = {"type": "ValueError", "message": "x", "traceback": "Traceback (most recent call last):\nValueError: x\n"}
    res = result(rank(0, RankState.FAILED, "ValueError: x", exception=tb),
                 rank(1, RankState.FAILED, "ValueError: x", exception=tb),
                 rank(2, RankState.FAILED, "ValueError: x", exception=tb, hint="look here"),
                 displayed=[0, 1])
    lines = DDPError(res)._render_traceback_()
    assert lines[0].endswith("ranks 0–2 failed")
    assert "  hint (rank 2): look here" in lines
    assert lines.count("--- rank 2 traceback ---") == 1 and "--- rank 0 traceback ---" not in lines
    assert lines[-1].startswith("(ranks 0–1: tracebacks in their output above; full per-rank logs")


def test_a_launch_that_failed_without_a_failed_rank_and_a_timeout():
    assert str(DDPError(result(rank(0, RankState.INTERRUPTED)))).startswith("the launch failed\n")
    timed = result(rank(0, RankState.TIMED_OUT), rank(1, RankState.TIMED_OUT), timed_out=True)
    with pytest.raises(DDPTimeout) as info:
        timed.raise_for_status()
    assert str(info.value).splitlines()[:2] == ["timed out", "rank 0: timed out"]


# ----------------------------------------------------------- exit states
@pytest.mark.parametrize("code, exception, sent, by_nbddp", [
    (None, None, set(), False), (None, None, {signal.SIGKILL}, True),
    (-15, None, {signal.SIGTERM}, True), (-15, None, {signal.SIGINT}, False),
    (130, None, {signal.SIGINT}, True), (1, {"type": "KeyboardInterrupt"}, {signal.SIGINT}, True),
    (1, {"type": "ValueError"}, {signal.SIGINT}, False), (0, None, {signal.SIGTERM}, False),
])
def test_ended_by_nbddp(code, exception, sent, by_nbddp):
    assert exitstates.ended_by_nbddp(code, exception, sent) is by_nbddp


@pytest.mark.parametrize("code, stop, sent, state, cause", [
    (0, None, set(), RankState.OK, ""),
    (-11, None, set(), RankState.KILLED, "crashed with SIGSEGV (segmentation fault)"),
    (2, None, set(), RankState.FAILED, "exited with code 2"),
    (-15, ("failfast", "after rank 1 failed"), {signal.SIGTERM}, RankState.TERMINATED,
     "stopped by nbddp after rank 1 failed"),
    (-15, ("timeout", "after the 5 s timeout"), {signal.SIGTERM}, RankState.TIMED_OUT, ""),
    (130, ("interrupt", "after the interrupt"), {signal.SIGINT}, RankState.INTERRUPTED, "stopped by the interrupt"),
    (3, ("failfast", "after rank 1 failed"), {signal.SIGTERM}, RankState.FAILED, "exited with code 3"),
])
def test_settle(code, stop, sent, state, cause):
    res = rank(0, RankState.RUNNING, exitcode=code)
    exitstates.settle(res, stop, sent)
    assert (res.state, res.cause) == (state, cause)


PEER_GONE = {"type": "RuntimeError", "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:3487"}


@pytest.mark.parametrize("exception, stop, state", [
    (PEER_GONE, ("timeout", "after the 5 s timeout"), RankState.TIMED_OUT),   # its peer's signal came first
    (PEER_GONE, ("interrupt", "after the interrupt"), RankState.INTERRUPTED),
    (PEER_GONE, None, RankState.FAILED),                                       # before nbddp stopped anything
    ({"type": "ValueError", "message": "bad"}, ("timeout", "after the 5 s timeout"), RankState.FAILED),
])
def test_a_rank_whose_peer_nbddp_stopped_is_stopped_too(exception, stop, state):
    res = rank(1, RankState.RUNNING, exitcode=1, exception=exception)
    exitstates.settle(res, stop, {signal.SIGTERM} if stop else set())
    assert res.state == state
    diagnosis.add_hints(RunResult(world_size=2, log_dir="", ranks=[res]))
    assert (res.hint is not None) is (exception is PEER_GONE and state == RankState.FAILED), \
        "the 'another rank ended' hint only where the rank failed by itself"


def test_torchruns_own_failfast_is_not_the_ranks_failure():
    res = rank(0, RankState.RUNNING, exitcode=-15)
    exitstates.settle_torchrun(res, None, set(), others_failed=True)
    assert (res.state, res.cause) == (RankState.TERMINATED, "stopped by torchrun after another rank failed")
    alone = rank(1, RankState.RUNNING, exitcode=-15)
    exitstates.settle_torchrun(alone, None, set(), others_failed=False)
    assert alone.state == RankState.KILLED
    ours = rank(2, RankState.RUNNING, exitcode=-15)
    exitstates.settle_torchrun(ours, ("timeout", "after the 1 s timeout"), {signal.SIGTERM}, others_failed=True)
    assert ours.state == RankState.TIMED_OUT


@pytest.mark.parametrize("pid, stop, agent_code, first_failed, state, cause", [
    (5, ("interrupt", "after the interrupt"), 1, None, RankState.INTERRUPTED, "stopped by the interrupt"),
    (None, None, 1, None, RankState.FAILED, "never started (torchrun ended before this rank ran)"),
    (5, None, 1, 3, RankState.TERMINATED, "stopped by torchrun after rank 3 failed"),
    (5, None, -9, None, RankState.FAILED, "ended without an exit status (torchrun exited with -9)"),
])
def test_a_torchrun_rank_without_an_exit_status(pid, stop, agent_code, first_failed, state, cause):
    res = rank(0, RankState.RUNNING, pid=pid, exitcode=7)
    assert exitstates.settle_unreported(res, stop, agent_code, first_failed) is True
    assert (res.state, res.cause) == (state, cause)


def test_a_torchrun_rank_without_an_exit_status_after_the_agent_succeeded_is_left_to_the_caller():
    res = rank(0, RankState.RUNNING, pid=5)
    assert exitstates.settle_unreported(res, None, 0, None) is False
    assert res.state == RankState.RUNNING


# --------------------------------------------- torchrun's ranks from status files
def test_status_files_confirm_renumber_restart_and_end_ranks(tmp_path):
    events, notes = [], []
    res = RunResult(ranks=[], world_size=4, log_dir=str(tmp_path))
    ranks = TorchrunRanks(res, str(tmp_path), 2, lambda *a: events.append((a[0], a[1].rank)), notes.append)
    for r in (0, 1):  # guesses for node 0 before the rendezvous
        ranks.get(r, r, 0)

    def write(r, **status):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(status))

    write(2, rank=2, local_rank=0, node_rank=1, pid=100, restart=0, started_at=1.0)
    ranks.scan(None, set())
    assert [(r.rank, r.local_rank, r.node_rank) for r in res.ranks] == [(1, 1, 0), (2, 0, 1)]  # renumbered
    assert res.ranks[1].stdout_path == str(tmp_path / "rank2.stdout")
    assert ranks.live() == {2: json.loads((tmp_path / "rank2.json").read_text())}
    write(2, rank=2, local_rank=0, node_rank=1, pid=101, restart=1, started_at=2.0)
    ranks.scan(None, set())
    assert notes == ["rank 2 restarted by torchrun (restart 1)"]
    write(2, rank=2, local_rank=0, node_rank=1, pid=101, restart=1, started_at=2.0, exitcode=1, ended_at=3.0,
          exception={"type": "ValueError", "message": "bad", "traceback": "", "cell_line": 4})
    ranks.scan(None, set())
    assert (res.ranks[1].state, res.ranks[1].cause) == (RankState.FAILED, "ValueError: bad at cell line 4")
    assert ranks.live() == {}
    ranks.settle_all(None, set(), 1, [(1, 1, -15)])  # torchrun's summary: it stopped rank 1
    assert (res.ranks[0].state, res.ranks[0].cause) == (
        RankState.TERMINATED, "stopped by torchrun after another rank failed")
    assert events == [("rank_started", 2), ("rank_started", 2), ("rank_exited", 2), ("rank_exited", 1)]
    assert DDPError(res).args[0].splitlines()[:2] == ["rank 2 failed",
                                                      "rank 2: failed (ValueError: bad at cell line 4)"]


def test_a_rank_torchrun_stopped_after_a_peer_was_killed_is_not_called_killed_from_outside(tmp_path):
    """Rank 1 killed (SIGKILL, no status file), rank 0 then stopped by torchrun (SIGTERM): as
    torchrun's summary lists them (the rank it stopped first, the root cause last)."""
    res = RunResult(ranks=[], world_size=2, log_dir=str(tmp_path))
    ranks = TorchrunRanks(res, str(tmp_path), 2, lambda *a: None, lambda _: None)
    for r in (0, 1):
        ranks.get(r, r, 0)
    from test_torchrun_cli import AGENT_LOG_STOPPED

    ranks.settle_all(None, set(), 1, diagnosis.agent_failures(AGENT_LOG_STOPPED))
    assert [(r.state, r.cause) for r in res.ranks] == [
        (RankState.TERMINATED, "stopped by torchrun after another rank failed"),
        (RankState.KILLED, "killed by SIGKILL (from outside nbddp, or out of memory)")]


def test_ends_read_in_one_scan_are_settled_in_the_order_they_happened(tmp_path):
    """Rank 1 failed, then torchrun stopped rank 0 (SIGTERM): both status files may be new in the
    same scan, and the folder may list rank 0's first. Rank 0 is still torchrun's fail-fast, not
    "terminated by SIGTERM from outside nbddp" (seen once in CI)."""
    res = RunResult(ranks=[], world_size=2, log_dir=str(tmp_path))
    ranks = TorchrunRanks(res, str(tmp_path), 2, lambda *a: None, lambda _: None)
    for r in (0, 1):
        ranks.get(r, r, 0)
    bad = {"type": "ValueError", "message": "bad shard", "traceback": "", "cell_line": 4}
    stopped = dict(rank=0, local_rank=0, node_rank=0, pid=200, restart=0, started_at=1.0, exitcode=-15, ended_at=5.2)
    failed = dict(rank=1, local_rank=1, node_rank=0, pid=201, restart=0, started_at=1.0, exitcode=1, ended_at=5.1,
                  exception=bad)
    (tmp_path / "rank0.json").write_text("{}")
    (tmp_path / "rank1.json").write_text("{}")
    first, second = glob.glob(str(tmp_path / "rank*.json"))  # the order a scan lists them in
    Path(first).write_text(json.dumps(stopped))  # the later end listed first: the case that went wrong
    Path(second).write_text(json.dumps(failed))
    ranks.scan(None, set())
    assert [(r.state, r.cause) for r in res.ranks] == [
        (RankState.TERMINATED, "stopped by torchrun after another rank failed"),
        (RankState.FAILED, "ValueError: bad shard at cell line 4")]
