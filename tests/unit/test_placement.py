"""GPU placement rules, on CPU: the device count is passed in at the boundary (no torch mocking)."""
import pytest

from nbddp import DDPUsageError
from nbddp.core import placement
from nbddp.core.ddpline import parse_line
from nbddp.core.envvars import rank_env


def spec(line):
    return parse_line(line)


def test_no_cuda_means_gloo_and_no_variables():
    p = placement.plan(spec("-n 4"), 0)
    assert p.backend == "gloo" and p.devices == () and p.device_of(0) is None
    assert p.env == ()


def test_cuda_means_nccl_and_one_device_per_local_rank():
    p = placement.plan(spec("-n 4"), 4)
    assert p.backend == "nccl" and p.devices == (0, 1, 2, 3)
    assert [p.device_of(r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert p.env == ()  # all visible: cuda:LOCAL_RANK is already right


def test_gpus_choose_devices_through_cuda_visible_devices():
    s = spec("-n 3 --gpus 0,1,3")
    p = placement.plan(s, 4)
    assert p.devices == (0, 1, 3) and p.backend == "nccl"
    assert dict(p.env) == {"CUDA_VISIBLE_DEVICES": "0,1,3"}
    # LOCAL_RANK indexes the chosen devices: rank 2 uses cuda:2, which is physical device 3
    assert p.device_of(2) == "cuda:2" and p.physical[2] == "3"


def test_gpus_are_numbered_within_an_existing_cuda_visible_devices():
    s = spec("-n 2 --gpus 1,2")
    env = placement.plan(s, 3, {"CUDA_VISIBLE_DEVICES": "4,6,7"}).env
    assert dict(env) == {"CUDA_VISIBLE_DEVICES": "6,7"}


@pytest.mark.parametrize("line, count, words", [
    ("-n 4", 2, "4 ranks per node but 2 GPUs here"),
    ("-n 3 --gpus 0,1", 4, "3 ranks per node but 2 GPUs chosen"),
])
def test_auto_with_fewer_gpus_than_ranks_falls_back_to_gloo_and_says_why(line, count, words):
    p = placement.plan(spec(line), count)
    assert p.backend == "gloo" and words in p.note and "use -n 2 per node for nccl" in p.note


def test_enough_gpus_means_no_note():
    assert placement.plan(spec("-n 2"), 2).note == ""


def test_per_node_with_several_nodes():
    p = placement.plan(spec("-n 4 --nnodes 2 --gpus 2,3"), 4)
    assert p.devices == (2, 3) and p.backend == "nccl"


@pytest.mark.parametrize("line, count, words", [
    ("-n 4 --backend nccl", 2, "4 ranks per node but 2 GPUs here"),
    ("-n 3 --gpus 0,1 --backend nccl", 4, "3 ranks per node but 2 GPUs chosen"),
    ("-n 2 --gpus 0,5", 4, "--gpus 5: this machine has 4 CUDA devices"),
    ("-n 2 --gpus 0,0", 4, "names a device twice"),
    ("-n 2 --gpus 0,1", 0, "this machine has none"),
    ("-n 2 --backend nccl", 0, "nccl needs CUDA devices"),
])
def test_impossible_placements_are_one_line_usage_errors(line, count, words):
    with pytest.raises(DDPUsageError) as info:
        placement.plan(spec(line), count)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_gloo_may_share_devices():
    p = placement.plan(spec("-n 4 --backend gloo"), 2)
    assert p.backend == "gloo" and p.devices == (0, 1)


def test_rank_env_adds_visible_devices_only_with_gpus():
    kw = dict(master_port=1, run_id="r", error_file="e", base_env={"PATH": "/bin"})
    plain = rank_env(spec("-n 2"), 0, devices_env=placement.plan(spec("-n 2"), 0).env, **kw)
    assert "CUDA_VISIBLE_DEVICES" not in plain
    gpus = spec("-n 2 --gpus 1,3")
    chosen = rank_env(gpus, 1, devices_env=placement.plan(gpus, 4).env, **kw)
    assert chosen["CUDA_VISIBLE_DEVICES"] == "1,3" and chosen["LOCAL_RANK"] == "1"
    # the user's --env still wins
    mine_spec = spec("-n 2 --gpus 1,3 --env CUDA_VISIBLE_DEVICES=0,1")
    mine = rank_env(mine_spec, 1, devices_env=placement.plan(mine_spec, 4).env, **kw)
    assert mine["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_nbddp_backend_outside_nbddp_applies_autos_rule_to_torchruns_local_world_size():
    """The same code under plain torchrun: nccl only where each of the node's ranks has a GPU
    (placement.auto_backend, the rule --backend auto follows; this machine has none)."""
    assert [placement.auto_backend(d, n) for d, n in ((0, 1), (1, 1), (1, 2), (4, 4), (4, 8))] == \
        ["gloo", "nccl", "gloo", "nccl", "gloo"]
    import nbddp

    assert nbddp.backend() == "gloo"
