"""%ddp_diff / --diff, pure: the ranks' summaries compared against rank 0, what is computed, the
report's words, and the line parsed (nbddp/core/rankdiff.py, nbddp/core/linecommands.py). The
same on real ranks: tests/kernel/test_rank_diff.py."""
import pytest

from nbddp.core import rankdiff
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import choose_source, make_spec
from nbddp.core.linecommands import parse_diff_line


def t(name, h, shape=(3,), dtype="float32"):
    return [name, rankdiff.TENSOR, dtype, list(shape), h]


def summaries(*per_rank, problems=None):
    return {rank: {"entries": entries, "problems": (problems or {}).get(rank, [])}
            for rank, entries in enumerate(per_rank)}


def test_equal_ranks_say_so_with_the_count():
    same = [t("model.w", "a"), t("model.b", "b"), ["rng.torch", rankdiff.RNG, "state", [], "r"]]
    comparison = rankdiff.compare(summaries(same, same, same))
    assert comparison.differences == []
    assert rankdiff.to_compute(comparison) == []
    assert rankdiff.report(comparison, {}) == "%ddp_diff: all 3 ranks equal (2 tensors, 1 generator state)"


def test_differing_tensors_name_the_ranks_and_the_computed_difference():
    ref = [t("model.w", "a"), t("model.b", "b"), t("model.bn.running_mean", "c")]
    odd = [t("model.w", "a"), t("model.b", "B"), t("model.bn.running_mean", "C")]
    comparison = rankdiff.compare(summaries(ref, ref, odd, odd))
    assert [(d.name, d.ranks, d.why) for d in comparison.differences] == [
        ("model.b", (2, 3), "value"), ("model.bn.running_mean", (2, 3), "value")]
    assert rankdiff.to_compute(comparison) == [("model.b", (2, 3)), ("model.bn.running_mean", (2, 3))]
    text = rankdiff.report(comparison, {2: {"model.b": 0.5, "model.bn.running_mean": 1.0},
                                        3: {"model.b": 0.75, "model.bn.running_mean": 1.0}})
    lines = text.splitlines()
    assert lines[0] == "%ddp_diff: 2 of 3 tensors differ across the 4 ranks (each against rank 0):"
    assert lines[1].split() == ["model.b", "ranks", "2–3", "max", "abs", "diff", "0.75", "(largest,", "on",
                                "rank", "3)"]
    assert lines[2].split()[:2] == ["model.bn.running_mean", "ranks"]
    assert len(lines) == 3


def test_shape_dtype_missing_extra_and_values_are_said_apart():
    ref = [t("w", "a", (4, 3)), t("x", "x"), t("gone", "g"), ["opt.lr", rankdiff.VALUE, "float", [], "h", "0.1"]]
    other = [t("w", "a2", (4, 2)), t("x", "x", dtype="float64"), t("new", "n"),
             ["opt.lr", rankdiff.VALUE, "float", [], "h2", "0.01"]]
    comparison = rankdiff.compare(summaries(ref, other))
    assert [(d.name, d.why) for d in comparison.differences] == [
        ("w", "shape"), ("x", "dtype"), ("gone", "missing"), ("opt.lr", "value"), ("new", "extra")]
    assert rankdiff.to_compute(comparison) == []  # only values of one shape are computed
    text = rankdiff.report(comparison, {})
    assert "shape [4, 2] vs [4, 3] on rank 0" in text
    assert "dtype float64 vs float32 on rank 0" in text
    assert "missing there (rank 0 has it)" in text
    assert "0.01 vs 0.1 on rank 0" in text
    assert "not on rank 0" in text


def test_only_the_first_few_are_computed_and_the_list_is_bounded():
    ref = [t(f"p{i}", "a") for i in range(15)]
    odd = [t(f"p{i}", "b") for i in range(15)]
    comparison = rankdiff.compare(summaries(ref, odd))
    assert [name for name, _ in rankdiff.to_compute(comparison)] == [f"p{i}" for i in range(rankdiff.COMPUTED)]
    computed = {1: {f"p{i}": 1.0 for i in range(rankdiff.COMPUTED)}}
    lines = rankdiff.report(comparison, computed).splitlines()
    assert len(lines) == 1 + rankdiff.SHOWN + 1
    assert lines[-1] == "  … and 5 more"
    assert "max abs diff computed for the first 5 only, 256 MiB in all" in lines[rankdiff.COMPUTED + 1]


def test_what_rank_0_writes_is_bounded_in_bytes():
    big = (rankdiff.COMPUTED_BYTES // 4 + 1,)  # float32: one past the bound
    ref = [t("huge", "a", big), t("small", "a", (2,)), t("bf", "a", (8,), "bfloat16")]
    odd = [t("huge", "b", big), t("small", "b", (2,)), t("bf", "b", (8,), "bfloat16")]
    comparison = rankdiff.compare(summaries(ref, odd))
    assert rankdiff.to_compute(comparison) == [("small", (1,)), ("bf", (1,))]
    assert "values differ (max abs diff computed for" in rankdiff.report(comparison, {1: {"small": 1.0}})


def test_rank_0_as_the_odd_one_out_is_said():
    ref, odd = [t("w", "a")], [t("w", "b")]
    text = rankdiff.report(rankdiff.compare(summaries(ref, odd, odd)), {1: {"w": 2.0}, 2: {"w": 2.0}})
    assert text.endswith("(ranks 1–2 agree with each other: rank 0 is the odd one)")
    assert "odd one" not in rankdiff.report(rankdiff.compare(summaries(ref, odd)), {1: {"w": 2.0}})


def test_rng_difference_has_no_distance():
    ref, odd = [["rng.torch", rankdiff.RNG, "state", [], "a"]], [["rng.torch", rankdiff.RNG, "state", [], "b"]]
    comparison = rankdiff.compare(summaries(ref, odd))
    assert rankdiff.to_compute(comparison) == []
    assert "generator state differs" in rankdiff.report(comparison, {})


def test_problems_name_the_ranks_unless_all():
    found = summaries([], [], problems={0: ["no name 'x'"], 1: ["no name 'x'", "no name 'y'"]})
    assert rankdiff.problems(found) == "no name 'x'; no name 'y' (on rank 1)"
    assert rankdiff.problems(summaries([], [])) is None


def test_the_line_and_the_option():
    assert parse_diff_line("model opt,rng", running=True) == ("model", "opt", "rng")
    assert parse_diff_line("model.fc", running=True) == ("model.fc",)
    for line, says in (("", "usage"), ("model-1", "not a Python name"), ("model", "none is running")):
        with pytest.raises(DDPUsageError, match=says):
            parse_diff_line(line, running=line != "model")
    assert parse_line("-n 2 --diff model,opt").diff == ("model", "opt")
    with pytest.raises(DDPUsageError, match="--diff compares nbddp's own ranks"):
        make_spec(n=2, diff=["model"], launcher="torchrun")
    with pytest.raises(DDPUsageError, match="not a callable"):
        choose_source(make_spec(n=2, diff=["model"]), func=True)
    pool = make_spec(n=2)
    with pytest.raises(DDPUsageError, match="drop --ranks"):
        choose_source(make_spec(n=2, diff=["model"], ranks_shown=[0]), pool=pool)


@pytest.mark.parametrize("line", ["model\0", "a..b", "model;import os", "mod-el", ".", "x.", "é\ud800",
                                  "model " * 5000 + "-x", "'model'", "1.model"])
def test_hostile_lines_are_one_usage_line(line):
    with pytest.raises(DDPUsageError) as caught:
        parse_diff_line(line, running=True)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("%ddp_diff: ")
    assert len(str(caught.value)) < 400
