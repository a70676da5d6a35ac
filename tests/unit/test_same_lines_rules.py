"""Identical lines from several ranks said once (nbddp/core/samelines.py), pure."""
from nbddp.core.samelines import SameLines


def feed(merger, events, now=0.0):
    out = []
    for rank, line in events:
        out += merger.add(rank, line, now)
    return out


def test_a_line_every_rank_prints_goes_out_once_as_soon_as_the_last_rank_printed_it():
    m = SameLines(range(8))
    assert feed(m, [(r, "epoch 1 done") for r in (3, 0, 7, 1, 2, 6, 4)]) == []   # rank 5 may still print it
    assert m.add(5, "epoch 1 done", 0.01) == [((0, 1, 2, 3, 4, 5, 6, 7), "epoch 1 done")]
    assert len(m) == 0


def test_ranks_that_differ_are_shown_apart_in_first_printed_order():
    m = SameLines(range(3))
    out = feed(m, [(0, "loss 0.5"), (1, "loss 0.7"), (2, "loss 0.5"), (0, "done"), (1, "done"), (2, "done")])
    # each rank went on to print "done", so no loss line waits for the others
    assert out == [((0, 2), "loss 0.5"), ((1,), "loss 0.7"), ((0, 1, 2), "done")]


def test_each_ranks_own_lines_keep_their_order():
    m = SameLines(range(2))
    out = feed(m, [(0, "a"), (0, "b"), (1, "b"), (1, "a")]) + m.flush()
    # rank 1's "a" came after its "b": it cannot join rank 0's earlier "a"
    assert out == [((0,), "a"), ((0, 1), "b"), ((1,), "a")]
    order = {r: [line for ranks, line in out if r in ranks] for r in (0, 1)}
    assert order == {0: ["a", "b"], 1: ["b", "a"]}


def test_the_same_line_printed_twice_by_a_rank_is_two_lines():
    m = SameLines(range(2))
    out = feed(m, [(0, "x"), (0, "x"), (1, "x"), (1, "x")])
    assert out == [((0, 1), "x"), ((0, 1), "x")]


def test_a_line_only_one_rank_prints_waits_at_most_the_hold_time():
    m = SameLines(range(2), hold_s=0.5)
    assert m.add(0, "saving checkpoint", 10.0) == []
    assert m.due(10.4) == []
    assert m.due(10.5) == [((0,), "saving checkpoint")]


def test_no_line_waits_for_a_rank_that_ended():
    m = SameLines(range(3))
    feed(m, [(0, "bye"), (1, "bye")])
    assert m.ended(2, 0.1) == [((0, 1), "bye")]


def test_held_lines_are_bounded_and_all_come_out_at_the_end():
    m = SameLines(range(2), max_open=100)
    out = feed(m, [(0, f"line {i}") for i in range(1000)])
    assert len(m) <= 101 and len(out) >= 899
    out += m.flush()
    assert [line for _, line in out] == [f"line {i}" for i in range(1000)]


def test_keys_can_carry_the_stream():
    m = SameLines(range(2))
    out = feed(m, [(0, ("stdout", "x")), (1, ("stdout", "x")), (1, ("stderr", "x"))]) + m.flush()
    assert out == [((0, 1), ("stdout", "x")), ((1,), ("stderr", "x"))]


# ---------------------------------------------- the all-ranks view and the transcript
def _collector(n=4, same_lines="merge"):
    from nbddp.core.launchrules import make_spec
    from nbddp.core.result import RankResult, RunResult
    from nbddp.core.states import RankState
    from nbddp.views.transcript import Collector

    spec = make_spec(n=n, same_lines=same_lines)
    c = Collector(spec)
    result = RunResult(ranks=[RankResult(rank=r, local_rank=r, node_rank=0, state=RankState.OK) for r in range(n)],
                       world_size=n, log_dir="/logs/1", started_at=1.0, ended_at=2.0)
    c.launch_started(result, spec, "gloo")
    return c, result


def test_the_all_ranks_view_says_a_line_every_rank_printed_once():
    from nbddp.views.transcript import lines_html

    c, result = _collector()
    for rank in (1, 0, 3, 2):
        c.output(rank, "stdout", f"epoch 1 done\nloss {rank}\n".encode())
    for rank in range(4):
        c.rank_exited(result.rank(rank))
    c.launch_finished(result)
    entries = list(c.all.lines)
    assert entries[0] == ("stdout", ((0, 1, 2, 3), "epoch 1 done"))
    assert sorted(e for e in entries[1:]) == [("stdout", (r, f"loss {r}")) for r in range(4)]
    assert "[ranks 0–3]: epoch 1 done" in lines_html(entries, with_rank=True)
    assert "[rank2]: loss 2" in lines_html(entries, with_rank=True)


def test_apart_keeps_every_ranks_line_in_the_all_ranks_view():
    c, result = _collector(n=2, same_lines="apart")
    for rank in (0, 1):
        c.output(rank, "stdout", b"epoch 1 done\n")
    c.launch_finished(result)
    assert list(c.all.lines) == [("stdout", (0, "epoch 1 done")), ("stdout", (1, "epoch 1 done"))]


def test_the_transcript_gives_ranks_with_the_same_output_one_section():
    from nbddp.views.transcript import render_html, render_text

    c, result = _collector()
    for rank in range(4):
        c.output(rank, "stdout", b"epoch 1 done\nepoch 2 done\n" if rank != 2 else b"epoch 1 done\nNaN!\n")
    c.launch_finished(result)
    text = render_text(c)
    assert "--- ranks 0–1,3, the same on each (2 lines) ---" in text and "--- rank 2 (2 lines) ---" in text
    assert text.count("epoch 2 done") == 1 and text.count("epoch 1 done") == 2, text
    page = render_html(c)
    assert "ranks 0–1,3, the same on each — ok (2 lines)" in page and page.count("epoch 2 done") == 1
    c2, _ = _collector(same_lines="apart")
    for rank in range(4):
        c2.output(rank, "stdout", b"epoch 1 done\n")
    c2.launch_finished(c2.result)
    assert render_text(c2).count("epoch 1 done") == 4
