"""--fake's pure parts: which ranks run, the option rules (one line each, before anything
starts), the byte arithmetic of a step's collectives and the report's words (the ranks
themselves: tests/kernel/test_fake.py)."""
import pytest

from nbddp.core import fakereport as fr
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import check_pool_spec, choose_source, make_spec
from nbddp.core.result import launch_result


def test_only_rank_0_or_the_named_ranks_run_and_are_shown():
    spec = parse_line("-n 512 --fake")
    assert spec.fake and spec.world_size == 512 and spec.ranks_run == (0,)
    assert spec.shown(0) and not spec.shown(1)
    spec = parse_line("-n 512 --nproc-per-node 8 --nnodes 64 --fake --ranks 0,37")
    assert spec.ranks_run == (0, 37) and spec.node_of(37) == 4 and spec.local_rank_of(37) == 5
    assert [r.rank for r in launch_result(spec, "/tmp/x").ranks] == [0, 37]
    assert parse_line("-n 4").ranks_run == (0, 1, 2, 3)


def test_a_fake_world_is_not_bounded_by_this_machine_but_its_running_ranks_are():
    assert make_spec(n=65536, fake=True).world_size == 65536
    with pytest.raises(DDPUsageError, match=r"^%%ddp: --fake --ranks: 3 ranks is more than --max-ranks 2"):
        make_spec(n=512, fake=True, ranks_shown=[0, 1, 2], max_ranks=2)
    with pytest.raises(DDPUsageError, match=r"--ranks 600 outside 0\.\.511"):
        parse_line("-n 512 --fake --ranks 600")


@pytest.mark.parametrize("line, says", [
    ("-n 8 --fake --launcher torchrun", "--launcher torchrun starts every rank for real"),
    ("-n 8 --fake --launcher slurm", "--launcher slurm starts every rank"),
    ("-n 8 --fake --launcher ray", "--launcher ray starts every rank"),
    ("-n 8 --fake --backend nccl", "--backend nccl cannot apply"),
    ("-n 8 --fake --ranks 1,1", "names a rank twice"),
    ("-n 8 --fake --diff model", "--diff compares every rank's values"),
])
def test_bad_combinations_are_one_line(line, says):
    with pytest.raises(DDPUsageError, match=says) as info:
        parse_line(line)
    assert "\n" not in str(info.value)


def test_a_fake_cell_never_goes_to_the_pool_and_a_pool_is_never_fake():
    pool = make_spec(n=2)
    assert choose_source(make_spec(n=512, fake=True), pool=pool) == "local"
    with pytest.raises(DDPUsageError, match=r"^%ddp_pool: --fake runs a cell"):
        check_pool_spec(make_spec(n=2, fake=True))


def test_ring_bytes_per_kind():
    assert fr.ring_sent("all_gather", 512, 8) == 448          # (g-1)/g of the gathered buffer
    assert fr.ring_sent("reduce_scatter", 512, 8) == 448
    assert fr.ring_sent("all_reduce", 512, 8) == 896          # reduce-scatter, then all-gather
    assert fr.ring_sent("broadcast", 512, 8) == 512
    assert fr.ring_sent("all_reduce", 512, 1) == 0            # a group of one sends nothing
    assert fr.kind_of("_allgather_base_") == "all_gather" and fr.kind_of("aten.mm") is None


def test_a_step_is_the_last_optimizer_step_and_its_collectives_add_up():
    records = [("broadcast", 100, 4, 0), ("all_reduce", 1000, 4, 0), ("all_reduce", 1000, 4, 1),
               ("all_gather", 400, 4, 1), ("all_gather", 400, 4, 1)]
    phase, what = fr.step_of(2)
    assert phase == 1 and what.startswith("step 2")
    assert fr.per_kind(records, phase) == {"all_gather": {"count": 2, "bytes": 800, "sent": 600},
                                           "all_reduce": {"count": 1, "bytes": 1000, "sent": 1500}}
    assert fr.step_of(1)[0] == 0 and fr.step_of(0) == (None, "the whole cell (no optimizer step ran)")
    assert fr.per_kind(records, None)["all_reduce"]["count"] == 2


def test_the_report_says_what_is_held_sent_and_not_known():
    data = {"rank": 37, "world_size": 512, "modules": 1, "optimizers": 1, "params": 3 << 20, "numel": 786432,
            "grads": 3 << 20, "optim": 6 << 20, "steps": 1, "peaks": [], "no_peak": None,
            "collectives": [("all_gather", 1 << 30, 512, 0)]}
    text = "\n".join(fr.report_lines(data))
    assert "rank 37 of 512 (nothing ran at that scale" in text
    assert "12 MiB: parameters 3 MiB (786,432 elements), gradients 3 MiB, optimizer state 6 MiB" in text
    assert "all_gather         1 x,      1 GiB of buffers,   1022 MiB sent" in text
    assert ("peak memory of the cell up to its one optimizer step (setup included): not known (torch's MemTracker "
            "saw no tensor in it)") in text
    failed = {**data, "no_peak": "torch's MemTracker failed in this cell (KeyError: 1)"}
    assert "not known (torch's MemTracker failed in this cell (KeyError: 1))" in "\n".join(fr.report_lines(failed))
    assert "no nn.Module" in "\n".join(fr.report_lines({**data, "modules": 0}))
    assert fr.report_lines({**data, "notes": ["DDP on meta keeps"]})[-1] == "  note: DDP on meta keeps"
    assert fr.human(1536) == "1.5 KiB" and fr.human(100) == "100 B"


def test_the_peak_is_the_counted_steps_by_kind_and_says_what_it_leaves_out():
    phases = [{"device": "meta", "total": 100, "by": {"Parameter": 100}},
              {"device": "meta", "total": (8 << 20) + 1536, "by": {"Parameter": 4 << 20, "Gradient": 4 << 20,
                                                                     "Activation": 1536, "Temp": 0}},
              {"device": "meta", "total": 7, "by": {"Parameter": 7}}]
    data = {"rank": 0, "world_size": 8, "modules": 1, "params": 0, "numel": 0, "grads": 0, "optim": 0,
            "steps": 2, "collectives": [], "peaks": phases}
    line = [ln for ln in fr.report_lines(data) if "peak memory" in ln]
    # the phase of the last step (the one the collectives are counted for), not the first or the tail
    assert line == ["  peak memory of step 2 (the last optimizer step; 2 ran): 8 MiB on meta (parameters 4 MiB, "
                    "gradients 4 MiB, activations 1.5 KiB): this rank's tensors as torch's MemTracker counts them, "
                    "not the CUDA context, the allocator's caching and fragmentation, or NCCL's buffers"], line


def test_the_launch_line_says_nothing_ran_at_that_scale():
    result = launch_result(make_spec(n=512, fake=True, ranks_shown=[0, 37]), "/tmp/x")
    for r in result.ranks:
        r.state = "ok"
    result.ended_at = result.started_at + 1.5
    assert result.summary() == ("ranks 0,37 of a 512-rank fake world finished ok in 1.50 s; nothing ran at "
                                "that scale: no other rank ran and no collective moved data (torch's fake backend)")


def test_the_transcript_says_the_other_ranks_did_not_run():
    from nbddp.views import transcript

    spec = make_spec(n=512, fake=True)
    result = launch_result(spec, "/tmp/x")
    result.ranks[0].state, result.ranks[0].exitcode = "ok", 0
    collector = transcript.Collector(spec)
    collector.launch_started(result, spec, "gloo")
    text, html = transcript.render_text(collector), transcript.render_html(collector)
    assert "nbddp: rank 0 of a 512-rank fake world" in text and list(collector.tails) == [0]
    for shown in (text, html):
        assert "ranks 1–511: not run (--fake runs only the ranks it names: nothing ran at that scale)" in shown
        assert "other nodes" not in shown
    assert "rank 0 of 512 (1 node × 512) on torch's fake backend" in transcript.launch_line(result, spec, "gloo")
