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
