"""``%%ddp --fake`` in a real kernel: the cell runs unchanged as chosen ranks of a large world on
torch's fake backend, and each rank's numbers (bytes held, a step's collectives) are those
computed here by hand for DDP, FSDP2 on 1-D and 2-D meshes, and TP; 512 ranks cost what 8 do;
bad combinations are one line (the pure rules: tests/unit/test_fake_rules.py)."""
import json

import pytest

F = 4  # bytes of a float32

SETUP = """
import os, resource, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
torch.manual_seed(0)
"""

STEPS = """
for _ in range(int(os.environ.get("STEPS", "2"))):
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
print("backend", dist.get_backend(), "world", dist.get_world_size(), "rank", dist.get_rank(), "pid", os.getpid(),
      "rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

DDP = SETUP + """
dist.init_process_group("gloo")
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
""" + STEPS

FSDP = SETUP + """
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", SHAPE)
model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters())
""" + STEPS

TP = SETUP + """
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
model = nn.Sequential(nn.Linear(64, 1024), nn.Linear(1024, 64))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
opt = torch.optim.AdamW(model.parameters())
""" + STEPS


def fake_run(kernel, line: str, cell: str) -> tuple[dict[int, dict], str]:
    """Run a --fake cell; each rank's measured data (from _ddp) and the cell's output."""
    reply = kernel.ok(f"%%ddp {line} --timeout 120\n{cell}", timeout=180)
    data = kernel.ok("import json; print(json.dumps({r.rank: r.fake for r in _ddp.ranks}))", timeout=30)
    return {int(k): v for k, v in json.loads(data.stdout).items()}, reply.text


def step(data: dict) -> dict:
    """The last step's collectives per kind: (count, buffer bytes, group size of each)."""
    out: dict = {}
    for kind, nbytes, group, phase in data["collectives"]:
        if phase == data["steps"] - 1:
            count, total, groups = out.get(kind, (0, 0, set()))
            out[kind] = (count + 1, total + nbytes, groups | {group})
    return out


@pytest.fixture(scope="module")
def loaded(kernel):
    kernel.ok("%load_ext nbddp", timeout=120)
    return kernel


def test_ddp_holds_the_whole_model_and_all_reduces_its_gradients_once_a_step(loaded):
    # three steps: the second one's forward broadcasts the buckets' new order (DDP rebuilds them
    # in the order the first backward produced the gradients); the third is steady
    ranks, text = fake_run(loaded, "-n 512 --fake --env STEPS=3", DDP)
    d = ranks[0]
    params = 2 * (64 * 64 + 64) * F           # every rank holds the whole model
    assert (d["params"], d["grads"], d["optim"]) == (params, params, params)  # SGD momentum: one buffer
    # one bucket (under DDP's first-bucket cap of 1 MiB), all-reduced over all 512 ranks
    assert step(d) == {"all_reduce": (1, params, {512})}, d["collectives"]
    assert "[rank0]:backend fake world 512 rank 0" in text, text
    assert "nothing ran at that scale" in text and "[rank1]" not in text


def test_fsdp2_on_a_1d_mesh_holds_a_shard_and_gathers_each_layer_twice(loaded):
    cell = FSDP.replace("SHAPE", "(8,)")
    ranks, _ = fake_run(loaded, "-n 8 --fake", cell)
    d = ranks[0]
    shard = (64 * 64 // 8 + 64 // 8) * F      # rows of the weight and of the bias over 8 ranks
    assert (d["params"], d["grads"]) == (2 * shard, 2 * shard)
    assert d["optim"] == 2 * 2 * shard + 4 * F  # AdamW: exp_avg, exp_avg_sq, and a 0-d step per tensor
    # forward gathers each layer, backward gathers it again (resharded after forward), and
    # reduce-scatters its gradient; a buffer is the whole layer
    assert step(d) == {"all_gather": (4, 4 * 8 * shard, {8}), "reduce_scatter": (2, 2 * 8 * shard, {8})}


def test_hsdp_on_a_2d_mesh_shards_over_one_dim_and_all_reduces_over_the_other(loaded):
    cell = FSDP.replace("SHAPE", '(64, 8), mesh_dim_names=("replicate", "shard")')
    ranks, _ = fake_run(loaded, "-n 512 --nproc-per-node 8 --nnodes 64 --fake", cell)
    d = ranks[0]
    shard = (64 * 64 // 8 + 64 // 8) * F
    assert (d["params"], d["grads"]) == (2 * shard, 2 * shard)
    assert step(d) == {"all_gather": (4, 4 * 8 * shard, {8}), "reduce_scatter": (2, 2 * 8 * shard, {8}),
                       "all_reduce": (2, 2 * shard, {64})}


def test_tp_splits_the_pair_of_linears_and_all_reduces_the_activations(loaded):
    ranks, _ = fake_run(loaded, "-n 512 --fake", TP)
    d = ranks[0]
    col = (1024 // 512 * 64 + 1024 // 512) * F  # colwise: rows of weight and bias
    row = (64 * 1024 // 512 + 64) * F           # rowwise: columns of the weight; the bias replicated
    assert (d["params"], d["grads"], d["optim"]) == (col + row, col + row, 2 * (col + row) + 4 * F)
    # the rowwise output's partial sums, one all-reduce of the (4, 64) activations; the input's
    # gradient is not needed (the batch needs no grad)
    assert step(d) == {"all_reduce": (1, 4 * 64 * F, {512})}


def test_the_peak_of_a_step_is_the_parameters_the_gradients_and_little_else(loaded):
    # two bias-free 1024x1024 layers on meta, plain SGD (updates in place: no optimizer state),
    # gradients dropped after each step; a batch of 8 rows
    cell = SETUP + """
with torch.device("meta"):
    model = nn.Sequential(nn.Linear(1024, 1024, bias=False), nn.Linear(1024, 1024, bias=False))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 1024, device="meta")).sum().backward()
    opt.step()
    opt.zero_grad()
"""
    ranks, text = fake_run(loaded, "-n 64 --fake", cell)
    d = ranks[0]
    weight, rows = 1024 * 1024 * F, 8 * 1024 * F
    peak = d["peaks"][d["steps"] - 1]        # the last step's phase, the one the report shows
    by = peak["by"]
    assert peak["device"] == "meta" and by["Parameter"] == 2 * weight and by["Optstate"] == 0, peak
    # the backward's peak: both weights' gradients (the second kept while the first is computed)
    # beside the parameters, and no more than a few batch-sized tensors (input, hidden, its gradient)
    assert 2 * weight <= by["Gradient"] + by["Temp"] <= 2 * weight + 2 * rows, peak
    assert 4 * weight <= peak["total"] <= 4 * weight + 4 * rows, peak
    assert "peak memory of step 3 (the last optimizer step; 3 ran): 16.1 MiB on meta (parameters 8 MiB" in text, text


def test_chosen_ranks_each_run_in_their_own_process_with_their_own_shard(loaded):
    cell = FSDP.replace("SHAPE", "(512,)")
    ranks, text = fake_run(loaded, "-n 512 --fake --ranks 0,100", cell)
    assert sorted(ranks) == [0, 100]
    # 64 rows over 512 ranks: ranks 0–63 hold one row of each weight and one bias element, the rest none
    assert ranks[0]["params"] == 2 * (64 + 1) * F and ranks[100]["params"] == 0
    pids = {line.split(" pid ")[1].split()[0] for line in text.splitlines() if " pid " in line}
    assert len(pids) == 2 and "[rank100]:backend fake world 512 rank 100" in text, text


def test_512_ranks_take_seconds_and_no_more_memory_than_8(loaded):
    cell = FSDP.replace("SHAPE", '(int(os.environ["WORLD_SIZE"]),)')
    rss = {}
    for n in (8, 512):
        _, text = fake_run(loaded, f"-n {n} --fake", cell)
        took = float(loaded.ok("print(_ddp.elapsed)", timeout=30).stdout)
        assert took < 30, f"{n} fake ranks took {took:.1f} s"
        rss[n] = int(next(line for line in text.splitlines() if " rss " in line).split(" rss ")[1])
    assert rss[512] < rss[8] * 1.2, rss


@pytest.mark.parametrize("line, says", [
    ("%%ddp -n 8 --fake --launcher torchrun", "--launcher torchrun starts every rank for real"),
    ("%%ddp -n 8 --fake --backend nccl", "--backend nccl cannot apply"),
    ("%ddp_pool start -n 2 --fake", "%ddp_pool: --fake runs a cell"),
])
def test_bad_combinations_are_one_usage_error_line(loaded, line, says):
    reply = loaded.execute(f"{line}\nprint('ran')" if line.startswith("%%") else line, timeout=60)
    assert reply.status == "error" and "UsageError" in reply.stderr and says in reply.stderr, reply.text
    assert "ran" not in reply.stdout and "Traceback" not in reply.text


def test_a_model_on_meta_costs_no_memory_and_ddp_runs_its_step(loaded):
    cell = SETUP + """
dist.init_process_group("nccl")   # as on the cluster: redirected to the fake backend too
from torch.nn.parallel import DistributedDataParallel as DDP
with torch.device("meta"):
    model = nn.Sequential(*[nn.Linear(16384, 16384) for _ in range(4)])   # 4 GiB of float32
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 16384, device="meta")).sum().backward()
    opt.step()
print("rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    ranks, text = fake_run(loaded, "-n 512 --fake", cell)
    d = ranks[0]
    params = 4 * (16384 * 16384 + 16384) * F
    assert (d["params"], d["grads"]) == (params, params)
    # on meta DDP keeps its first bucket layout, all parameters in one bucket, and says so
    assert step(d) == {"all_reduce": (1, params, {512})} and "DDP on meta keeps its first buckets" in text
    # torch's MemTracker follows the 4 GiB model on meta through three steps (it refuses a second
    # forward of a root module in one region unless nbddp starts the module's stats afresh)
    assert d["peaks"][d["steps"] - 1]["by"]["Parameter"] == params and "peak memory of step 3" in text, d["peaks"]
    rss_kib = int(next(line for line in text.splitlines() if "]:rss " in line).split("rss ")[1])
    assert rss_kib * 1024 < params / 4, f"a rank holding a 4 GiB model on meta used {rss_kib} KiB"


def test_a_fake_cell_while_a_pool_runs_is_a_fresh_world_of_its_own(loaded):
    loaded.ok("%ddp_pool start -n 2 --timeout 60", timeout=120)
    try:
        ranks, text = fake_run(loaded, "-n 64 --fake", "import torch.distributed as dist\ndist.init_process_group()\n"
                                                       "print('world', dist.get_world_size(), dist.get_backend())")
        assert "[rank0]:world 64 fake" in text and list(ranks) == [0], text
        pool = loaded.ok("%%ddp --timeout 60\nimport torch.distributed as dist\nprint('pool', dist.is_initialized())",
                         timeout=60)
        assert "pool" in pool.stdout and "[rank1]" in pool.stdout, pool.text
    finally:
        loaded.ok("%ddp_pool stop", timeout=60)
