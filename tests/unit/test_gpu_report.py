"""The words for each rank's CUDA memory (pure: nbddp/core/gpureport.py), shown under the ranks'
states in both views. The measuring itself needs a GPU: tests/kernel/test_gpu.py."""
from nbddp.core import gpureport
from nbddp.core.launchrules import make_spec
from nbddp.core.result import OK, RankResult, RunResult
from nbddp.views import transcript

MiB = 1 << 20


def _used(device, peak_mib, held_mib=0.0, visible=None, count=4):
    return {"device": device, "visible": str(device if visible is None else visible), "count": count,
            "peak": int(peak_mib * MiB), "allocated": int(held_mib * MiB), "reserved": int(peak_mib * MiB)}


def _ranks(memory, node_of=lambda r: 0):
    return [RankResult(rank=r, local_rank=r, node_rank=node_of(r), state=OK, gpu_memory=m)
            for r, m in enumerate(memory)]


def test_no_line_where_no_rank_used_cuda():
    assert gpureport.lines(_ranks([None, None])) == []


def test_each_rank_says_its_device_peak_and_what_it_still_held():
    lines = gpureport.lines(_ranks([[_used(0, 64, 16)], [_used(1, 65.5)]]))
    assert lines[0].startswith("GPU memory (torch's peak allocated")
    assert lines[1:] == ["  rank 0: cuda:0 peak 64 MiB, 16 MiB held at the end",
                         "  rank 1: cuda:1 peak 65.5 MiB, 0 B held at the end"]


def test_a_renumbered_device_names_the_gpu_it_is():
    assert gpureport.device_name(_used(0, 1, visible=3)) == "cuda:0 (GPU 3)"
    assert gpureport.device_name(_used(2, 1)) == "cuda:2"
    assert gpureport.device_name(_used(0, 1, visible="GPU-5d3c")) == "cuda:0 (GPU-5d3c)"  # a UUID as given


def test_many_ranks_fold_into_a_range_and_the_largest():
    memory = [[_used(r % 8, 10 + r)] for r in range(16)]
    lines = gpureport.lines(_ranks(memory, node_of=lambda r: r // 8))
    assert lines[1] == "  ranks 0–15: peak 10 MiB to 25 MiB each"
    assert lines[2] == "  the most: rank 15: cuda:7 peak 25 MiB, 0 B held at the end"
    assert len(lines) == 3  # each node's ranks on their own GPUs: no note


def test_two_ranks_of_a_node_on_one_gpu_is_the_missing_set_device():
    lines = gpureport.lines(_ranks([[_used(0, 8)], [_used(0, 8)], [_used(2, 8)]]))
    assert lines[-1].startswith("note: ranks 0–1 all allocated on GPU 0: each rank should run on its own")
    assert "set_device(int(os.environ['LOCAL_RANK']))" in lines[-1]
    # the same GPU number on different nodes is two GPUs
    assert not [x for x in gpureport.lines(_ranks([[_used(0, 8)], [_used(0, 8)]], node_of=lambda r: r))
                if x.startswith("note")]
    # fewer GPUs than ranks (auto chose gloo and said so): sharing is expected, not a mistake
    assert not [x for x in gpureport.lines(_ranks([[_used(0, 8, count=1)], [_used(0, 8, count=1)]]))
                if x.startswith("note")]


def test_both_views_show_the_lines_under_the_states():
    ranks = _ranks([[_used(0, 64, 16)], [_used(0, 64)]])
    for r in ranks:
        r.started_at, r.ended_at, r.exitcode = 100.0, 101.0, 0
    result = RunResult(ranks=ranks, world_size=2, log_dir="/tmp/logs", started_at=100.0, ended_at=101.5)
    spec = make_spec(n=2)
    c = transcript.Collector(spec)
    c.launch_started(result, spec, "nccl")
    c.launch_finished(result)
    text, page = transcript.render_text(c), transcript.render_html(c)
    assert text.index("rank 1: ok") < text.index("rank 0: cuda:0 peak 64 MiB, 16 MiB held at the end")
    assert "rank 1: cuda:0 peak 64 MiB" in page and 'class="nbddp-gpu"' in page
    note = page[page.index("note: ranks 0–1 all allocated on GPU 0"):]
    assert page[:page.index(note)].rsplit("<pre", 1)[1].count(transcript.WARN_TEXT) == 1  # a warning's colour
