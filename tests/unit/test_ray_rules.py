"""--launcher ray's pure parts: which cluster a cell goes to, the driver's config, the exported
Ray job's text, and the options' rules (no Ray started: tests/test_ray_launcher.py does that)."""
import re

import pytest

from nbddp.core import rayaddress, rayjob
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import make_spec


def test_the_flag_wins_over_ray_address_and_neither_means_a_local_ray():
    assert rayaddress.choose("10.0.0.1:6379", {"RAY_ADDRESS": "10.0.0.2:6379"}) == \
        rayaddress.RayAddress("10.0.0.1:6379", "--ray-address", "10.0.0.1", 6379)
    assert rayaddress.choose(None, {"RAY_ADDRESS": "ray://head"}) == \
        rayaddress.RayAddress("ray://head", "RAY_ADDRESS", "head", 10001)
    assert rayaddress.choose(None, {"RAY_ADDRESS": "head"}).port == 6379
    assert rayaddress.choose(None, {}).local and rayaddress.choose("local", {"RAY_ADDRESS": "x:1"}).local
    assert rayaddress.choose("auto", {}) == rayaddress.RayAddress("auto", "--ray-address")
    assert rayaddress.choose("[::1]:6379", {}).host == "::1"
    for bad in ("http://head:8265", "a b", "head:99999"):
        with pytest.raises(ValueError, match="--ray-address"):
            rayaddress.choose(bad, {})


def test_one_bundle_per_node_with_its_ranks_cpus_and_gpus_where_asked():
    spec = make_spec(nproc_per_node=4, nnodes=2, launcher="ray", backend="nccl", master_port=29400)
    cfg = rayjob.driver_config(spec, address=None, tail=["x.py"], env={"A": "1"}, cwd="/w", local_cpus=2)
    assert (cfg["nnodes"], cfg["cpus"], cfg["gpus"], cfg["port"], cfg["local_cpus"]) == (2, 4, 4, 29400, 4)
    assert cfg["argv"] == ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint={rayjob.ENDPOINT}", "x.py"]
    assert rayjob.driver_config(make_spec(n=2, launcher="ray"), address="h:1", tail=[], env={}, cwd=".")["gpus"] == 0


def test_the_exported_job_is_python_that_runs_the_driver_with_its_config():
    spec = parse_line("--nnodes 2 --nproc-per-node 2 --ray --export train.py -- --lr 0.1")
    text = rayjob.job_script(spec, "out/train.py", "--nnodes 2 --nproc-per-node 2 --ray")
    compile(text, "train_ray.py", "exec")
    scope = {}
    exec(text.split("if __name__")[0], scope)
    cfg = scope["CONFIG"]
    assert cfg["address"] == "auto" and cfg["working_dir"] == "." and cfg["cwd"] == "."
    assert cfg["argv"][-4:] == ["--tee=3", "train.py", "--lr", "0.1"]
    assert "ray job submit --working-dir . -- python train_ray.py" in text
    assert rayjob.job_path("out/train.py") == "out/train_ray.py"


@pytest.mark.parametrize("line, words", [
    ("--ray-address h:1", "use them together"),
    ("--ray", "--ray writes a Ray job next to the exported script"),
    ("--launcher ray --node-rank 0", "--node-rank"),
    ("--launcher ray --rdzv-endpoint h:1", "use it with --launcher torchrun"),
    ("--launcher ray --push x", "--push/--pull"),
    ("--launcher ray --gpus 0,1", "use --backend nccl (one GPU per rank)"),
])
def test_options_that_do_not_fit_ray_are_usage_errors(line, words):
    with pytest.raises(DDPUsageError, match=re.escape(words)):
        from nbddp.core.launchrules import choose_source

        choose_source(parse_line(line))


def test_the_cluster_runs_the_ranks_so_this_machines_bound_does_not_apply():
    assert make_spec(n=2048, nnodes=16, launcher="ray").world_size == 2048  # 128 a node: past this machine's
    with pytest.raises(DDPUsageError, match="more than this machine runs"):
        make_spec(n=2048, nnodes=16, launcher="torchrun", rdzv_endpoint="h:1")


def test_nccl_on_ray_takes_the_bundles_gpus_not_this_machines():
    """This machine has no GPU; a Ray node's bundle has one per rank (placement is not refused)."""
    from nbddp.core.launch import Launch
    from nbddp.sources.ray import RayLaunch

    spec = make_spec(n=2, launcher="ray", backend="nccl")
    launch = RayLaunch(Launch(spec, source="pass", sinks=(), cwd=".", env_base={}), rayaddress.RayAddress(None))
    assert launch.placement.backend == "nccl" and launch.placement.env == ()


def test_the_launch_line_says_how_ray_runs_the_nodes():
    from nbddp.core.result import launch_result
    from nbddp.views import transcript

    spec = make_spec(nproc_per_node=2, nnodes=2, launcher="ray")
    line = transcript.launch_line(launch_result(spec, "/tmp/x"), spec, "gloo")
    # before: "MASTER_PORT None" (the local launcher's words, a port Ray's nodes never use)
    assert line == ("4 ranks (2 nodes × 2), backend gloo, Ray: one torchrun per node from a placement group, "
                    "c10d rendezvous on the first node"), line
