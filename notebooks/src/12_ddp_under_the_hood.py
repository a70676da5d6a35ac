# %% title [markdown]
# # 12 · DDP under the hood (DDP 的内部机制)
#
# `DistributedDataParallel(model)` does four things, and this lesson does each by hand and measures it:
# 1. **at construction** it broadcasts rank 0's parameters and buffers, so every replica starts equal;
# 2. it registers an **autograd hook on every parameter**; during `backward()` each finished gradient is
#    copied into a **bucket** (buckets of about `bucket_cap_mb`, 25 MiB by default, the first one smaller;
#    filled in reverse parameter order, the order gradients become ready);
# 3. as soon as a bucket is full it **launches an asynchronous all-reduce** of it, while backward goes on
#    computing the earlier layers' gradients: communication **overlaps** computation;
# 4. at the end of `backward()` it waits for the buckets and writes the **averaged** gradients to `.grad`.
#
# Then three things it needs to be told: parameters that get no gradient (`find_unused_parameters`),
# batch statistics across ranks (`SyncBatchNorm`) and ranks with fewer batches than others (`Join`).
# Everything runs on CPU with gloo, but for the GPU cells of section 4 (`SyncBatchNorm` for real), which say
# so and do nothing without CUDA.

# %% parameters tags=["parameters"]
world_size = 2
hang_timeout = 5

# %% load-ext
# %load_ext nbddp

# %% ddp-by-hand-broadcast [markdown]
# ## 1 · DDP by hand: broadcast once, all-reduce the gradients, divide by the world size
# The same model, the same data, three steps of SGD: once wrapped in DDP, once by hand. Both start from
# different random weights on each rank (`manual_seed(rank)`), so the broadcast matters.

# %% ddp-by-hand-broadcast-ddp
# %%ddp -n $world_size --timeout 60 --pull by_hand
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def new_model():
    torch.manual_seed(rank)                       # different on every rank, on purpose
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

g = torch.Generator().manual_seed(100 + rank)     # each rank its own data
batches = [(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(3)]

ddp = DDP(new_model())
ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for x, y in batches:
    ddp_opt.zero_grad(); F.mse_loss(ddp(x), y).backward(); ddp_opt.step()

mine = new_model()
for p in mine.parameters():
    dist.broadcast(p.data, src=0)                 # (1) everyone starts from rank 0's weights
opt = torch.optim.SGD(mine.parameters(), lr=0.1)
for x, y in batches:
    opt.zero_grad(); F.mse_loss(mine(x), y).backward()
    for p in mine.parameters():                   # (2-4) without buckets: one all-reduce per tensor
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()

by_hand = {"max |DDP - by hand|": max((a - b).abs().max().item() for a, b in zip(ddp.parameters(), mine.parameters())),
           "weight sum": sum(p.sum().item() for p in mine.parameters())}
print(by_hand)
dist.destroy_process_group()

# %% ddp-by-hand-broadcast-code
for rank, b in enumerate(by_hand):
    print(f"rank {rank}: {b}")

# %% diverged-ranks [markdown]
# ### Without the broadcast: find the rank that diverged (`--diff`)
# Leave step (1) out and nothing fails. The all-reduce gives every rank the same averaged gradient, so SGD
# moves every replica by the same amount, and each keeps the random start its own seed gave it: a model
# that differs on every rank, training quietly. `--diff NAME` on the `%%ddp` line compares `NAME` across
# the ranks at the cell's end: each rank hashes every parameter and buffer (no tensor goes to the
# notebook, no collective runs), and for the first tensors that differ, the ranks that differ compute the
# max abs difference against rank 0's copy. The report comes after the ranks' output, and in `_ddp.diff`.
# (On a pool, `%ddp_diff mine opt rng` does the same between cells, for models, optimizers and the
# random generators.)

# %% diverged-ranks-ddp
# %%ddp -n $world_size --timeout 60 --diff mine
import torch, torch.distributed as dist, torch.nn.functional as F
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)                           # a seed per rank, and no broadcast: the mistake
mine = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(mine.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for _ in range(3):
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    opt.zero_grad(); F.mse_loss(mine(x), y).backward()
    for p in mine.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
dist.destroy_process_group()

# %% diverged-ranks-code
diverged = _ddp.diff                              # the report, as text

# %% diverged-fixed [markdown]
# The report names every parameter of `mine` and the ranks it differs on. The fix is step (1), what DDP's
# constructor does: broadcast rank 0's parameters (and buffers) before the first step. The same cell with
# it, and the same comparison:

# %% diverged-fixed-ddp
# %%ddp -n $world_size --timeout 60 --diff mine
import torch, torch.distributed as dist, torch.nn.functional as F
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
mine = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
for p in mine.parameters():
    dist.broadcast(p.data, src=0)                 # (1) the fix: everyone starts from rank 0's weights
opt = torch.optim.SGD(mine.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for _ in range(3):
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    opt.zero_grad(); F.mse_loss(mine(x), y).backward()
    for p in mine.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
dist.destroy_process_group()

# %% diverged-fixed-code
fixed = _ddp.diff

# %% buckets-communication-overlapping-backward [markdown]
# ## 2 · Buckets, and communication overlapping backward
# A comm hook sees each bucket as DDP hands it over (and here times it); a hook on the **first** layer's
# weight fires when the last gradient of backward is ready. The model: 6 layers of 256×256, 1.5 MiB of
# gradients, in three settings (torch 2.13, `_BucketCapacityConfig` in `torch/nn/parallel/distributed.py`):
# - `DDP(model)`, `bucket_cap_mb` not given: buckets of 25 MiB, **but the first bucket** (the last layers,
#   whose gradients are ready first) is capped at `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB, so that it can
#   leave early. This model gets **two** buckets: 1 MiB (layers 6 to 3; a bucket closes once it reaches its
#   cap, so it can pass it by one tensor) and 0.5 MiB (layers 2 and 1).
# - `bucket_cap_mb=25`, given explicitly: the first bucket gets that cap too, so the whole model is **one**
#   bucket, all-reduced after backward has produced the last gradient.
# - `bucket_cap_mb=0.25`: one bucket per layer; the first buckets are on their way while backward still
#   computes the earlier layers.
#
# In the first step DDP puts every parameter in one bucket (without `find_unused_parameters`), then
# rebuilds the buckets in the order the gradients arrived: what is drawn is the third step.

# %% buckets-communication-overlapping-backward-ddp
# %%ddp -n $world_size --timeout 60 --pull timeline@0
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.set_num_threads(1)
dist.init_process_group("gloo")
world = dist.get_world_size()

def average(state, bucket):       # the same result as DDP's default (which divides before the all-reduce)
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / world)

timeline = {}
for setting, kwargs in (("DDP(model)", {}), ("bucket_cap_mb=25", {"bucket_cap_mb": 25}),
                        ("bucket_cap_mb=0.25", {"bucket_cap_mb": 0.25})):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]), **kwargs)
    events = []
    def timed(state, bucket):
        events.append(("bucket", bucket.index(), bucket.buffer().numel(), time.perf_counter()))
        return average(state, bucket)
    model.register_comm_hook(None, timed)
    model.module[0].weight.register_hook(lambda g: events.append(("last grad", -1, 0, time.perf_counter())))
    for step in range(3):                         # DDP rebuilds its buckets after the first step
        events.clear()
        loss = model(torch.randn(64, 256)).pow(2).mean()
        t0 = time.perf_counter()
        loss.backward()
        t_end = time.perf_counter()
    timeline[setting] = {"events": [(kind, i, n, (t - t0) * 1e3) for kind, i, n, t in events],
                         "backward_ms": (t_end - t0) * 1e3}
    del model
for setting, tl in timeline.items():
    order = [f"bucket {i} ({n * 4 / 2**20:.2f} MiB)" if kind == "bucket" else "LAST GRAD" for kind, i, n, _ in tl["events"]]
    print(f"{setting:18}: {' -> '.join(order)}")
dist.destroy_process_group()

# %% buckets-communication-overlapping-backward-code
import matplotlib.pyplot as plt
heights = [max(2, sum(kind == "bucket" for kind, *_ in tl["events"])) for tl in timeline.values()]
fig, axes = plt.subplots(len(timeline), 1, figsize=(10, 1.2 + 0.45 * sum(heights)), sharex=True,
                         gridspec_kw={"height_ratios": heights})
for ax, (setting, tl) in zip(axes, timeline.items()):
    buckets = [(i, n, ms) for kind, i, n, ms in tl["events"] if kind == "bucket"]
    ax.axvspan(0, tl["backward_ms"], color="C0", alpha=0.15, label="backward (call to return)")
    for i, n, ms in buckets:                      # one row per bucket: no labels on top of each other
        ax.plot(ms, i, "v", color="C1", markersize=9)
    ax.set_yticks([i for i, _, _ in buckets], [f"bucket {i}, {n * 4 / 2**20:.2f} MiB" for i, n, _ in buckets], fontsize=8)
    ax.set_ylim(len(buckets) - 0.4, -0.6)
    for kind, _, _, ms in tl["events"]:
        if kind == "last grad":
            ax.axvline(ms, color="C3", linestyle="--", label="last gradient ready")
    ax.set_title(setting, fontsize=9, loc="left")
axes[0].legend(loc="lower right", fontsize=8)
axes[-1].set_xlabel("ms since backward() was called  (▼ = a bucket's all-reduce launched)")
fig.suptitle("DDP launches each bucket's all-reduce as soon as its gradients are ready")
fig.tight_layout(); plt.show()

# %% parameter-without-gradient-find_unused_parameters [markdown]
# ## 3 · A parameter without a gradient: `find_unused_parameters`
# DDP waits for **every** parameter's gradient before a bucket is complete. A layer that forward never
# used gets none, so the reduction never finishes, and the next iteration says so (torch's own error,
# caught on every rank). `find_unused_parameters=True` makes DDP walk the autograd graph after each
# forward and mark such parameters ready — at a cost on every step, so only where needed (or
# `static_graph=True` when the set never changes).

# %% parameter-without-gradient-find_unused_parameters-ddp
# %%ddp -n $world_size --timeout 60 --pull unused@0
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")

class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head_a, self.head_b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
    def forward(self, x):
        return self.head_a(self.body(x))          # head_b is never used

unused = {}
model = DDP(TwoHeads())
try:
    for step in range(2):
        model(torch.randn(4, 4)).sum().backward()
    unused["default"] = "no error"
except RuntimeError as exc:
    unused["default"] = str(exc).split(". ")[0]
model = DDP(TwoHeads(), find_unused_parameters=True)
for step in range(2):
    model(torch.randn(4, 4)).sum().backward()
unused["find_unused_parameters=True"] = f"{step + 1} steps, head_b.grad is {model.module.head_b.weight.grad}"
print(unused)
dist.destroy_process_group()

# %% batchnorm-across-ranks-syncbatchnorm [markdown]
# ## 4 · BatchNorm across ranks: `SyncBatchNorm`
# `BatchNorm` normalises with the mean and variance of **this rank's** batch: with 8 samples per rank, each
# rank uses different statistics than one big batch would. `SyncBatchNorm`'s forward computes this rank's
# per-channel mean and inverse standard deviation, **all-gathers** (mean, invstd, count) from every rank
# and combines them into the global batch's statistics (`torch.batch_norm_gather_stats_with_counts`); its
# backward **all-reduces** two per-channel sums of the gradient (torch 2.13,
# `torch/nn/modules/_functions.py`, class `SyncBatchNorm`). The counts weight each rank's statistics, so
# ranks may have different batch sizes; all-reducing the sums, sums of squares and counts would give the
# same numbers, but that is not what torch does. torch runs it only on accelerators: its forward accepts
# inputs on CUDA, XPU, HPU or a PrivateUse1 backend (`torch/nn/modules/batchnorm.py`), and DDP refuses a CPU
# module that contains one (caught below: torch's own message, from DDP's constructor). So the forward's
# statistics are done by hand here, the same way (all-gather each rank's mean, variance and count, combine),
# and compared with a `BatchNorm` over the whole global batch.

# %% batchnorm-across-ranks-syncbatchnorm-ddp
# %%ddp -n $world_size --timeout 60 --pull bn
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(7)
everything = torch.randn(8 * world, 3, generator=g) * torch.tensor([1.0, 2.0, 3.0]) + torch.arange(8.0 * world).unsqueeze(1)
x = everything[rank * 8:(rank + 1) * 8]           # this rank's 8 samples (their means differ by rank)

bn = {}
try:
    DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3))))
except ValueError as exc:
    bn["torch on CPU"] = str(exc)

local = torch.nn.functional.batch_norm(x, None, None, training=True)       # plain BatchNorm, this rank
mine = torch.stack([x.mean(0), x.var(0, unbiased=False), torch.full((3,), float(len(x)))])
gathered = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(gathered, mine)                    # every rank's (mean, var, count), as SyncBatchNorm's forward
means, vars_, counts = torch.stack(gathered).unbind(1)                     # each: world × channels
mean = (counts * means).sum(0) / counts.sum(0)                              # the global batch's mean
var = (counts * (vars_ + (means - mean) ** 2)).sum(0) / counts.sum(0)       # and its (biased) variance
synced = (x - mean) / torch.sqrt(var + 1e-5)
reference = torch.nn.functional.batch_norm(everything, None, None, training=True)[rank * 8:(rank + 1) * 8]
bn["|synced - whole batch|"] = (synced - reference).abs().max().item()
bn["|local BN - whole batch|"] = (local - reference).abs().max().item()
print(bn)
dist.destroy_process_group()

# %% syncbatchnorm-on-a-gpu [markdown]
# ### On a GPU: `SyncBatchNorm` for real
# These cells need CUDA; without it they say so and do nothing (their run on a GPU machine is
# `docs/lessons/gpu/12_ddp_under_the_hood.ipynb`, listed on the docs page *GPU runs*). One rank on one GPU:
# `convert_sync_batchnorm` swaps every `BatchNorm*d` for a `SyncBatchNorm`, and on the GPU DDP takes the
# model that it refused on CPU above. With one rank there is nothing to combine: its forward sees a world
# size of 1 and runs the plain `batch_norm` (torch 2.13, `SyncBatchNorm.forward`), so the output equals
# `BatchNorm`'s over this rank's batch.

# %% syncbatchnorm-one-gpu-ddp
# %%ddp -n 1 --timeout 60 --pull sync_bn@0
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sync_bn = None
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here (its run on a GPU: docs/lessons/gpu/12_ddp_under_the_hood.ipynb)")
else:
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    plain = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(plain)
    model = DDP(converted.to(device), device_ids=[local])        # accepted: the module is on a GPU
    x = torch.randn(8, 3, device=device)
    out = model(x)
    reference = torch.nn.functional.batch_norm(model.module[0](x), None, None, training=True)
    sync_bn = {"layers": [type(m).__name__ for m in model.module], "on": str(next(model.parameters()).device),
               "|SyncBatchNorm - BatchNorm|, 1 rank": (out - reference).abs().max().item()}
    print(sync_bn)
    dist.destroy_process_group()

# %% syncbatchnorm-one-gpu-code
if sync_bn is None:
    print("no GPU here: the cell above was skipped")
else:
    assert sync_bn["layers"] == ["Linear", "SyncBatchNorm"] and sync_bn["on"] == "cuda:0", sync_bn
    assert sync_bn["|SyncBatchNorm - BatchNorm|, 1 rank"] < 1e-5, sync_bn
    print("converted, accepted by DDP on the GPU; with one rank, the plain batch norm")

# %% syncbatchnorm-gpus [markdown]
# The statistics are combined only when there are several ranks, which under NCCL means several GPUs: the
# next cell needs a CUDA GPU for each of its `world_size` ranks (`torch.cuda.device_count() >=
# LOCAL_WORLD_SIZE`) and says so where there are fewer, as on one GPU. There it runs the data of the CPU cell
# above through a real `SyncBatchNorm` under DDP and compares each rank's output with `BatchNorm` over the
# whole global batch, as that cell did with its statistics made by hand.

# %% syncbatchnorm-gpus-ddp
# %%ddp -n $world_size --timeout 60 --pull synced_bn
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
local_ranks = int(os.environ["LOCAL_WORLD_SIZE"])
synced_bn = None
if not (torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks):
    print(f"skipped: needs one CUDA GPU per rank ({local_ranks} ranks, {torch.cuda.device_count()} GPUs here)")
else:
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)                     # the data of the CPU cell above
    everything = torch.randn(8 * world, 3, generator=g) * torch.tensor([1.0, 2.0, 3.0]) + torch.arange(8.0 * world).unsqueeze(1)
    x = everything[rank * 8:(rank + 1) * 8].to(device)
    model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3))).to(device),
                device_ids=[local])
    out = model(x).detach().cpu()                            # normalised with the global batch's statistics
    reference = torch.nn.functional.batch_norm(everything, None, None, training=True)[rank * 8:(rank + 1) * 8]
    synced_bn = (out - reference).abs().max().item()
    print(f"rank {rank}: |SyncBatchNorm - whole batch| = {synced_bn:.1e}")
    dist.destroy_process_group()

# %% syncbatchnorm-gpus-code
if synced_bn[0] is None:
    print("not enough GPUs here: the cell above was skipped")
else:
    assert max(synced_bn) < 1e-4, synced_bn
    print(f"SyncBatchNorm on {world_size} GPUs: every rank normalised with the whole batch's statistics")

# %% uneven-inputs-hang-join [markdown]
# ## 5 · Uneven inputs: the hang, and `Join`
# DDP's all-reduce in every `backward()` pairs up step *k* of every rank. If rank 1 has one batch more
# (an uneven split, lesson 05), its last backward waits for a partner that has left the loop: a hang.
# First the loop as one would write it. torch itself would give up only after the process group's
# timeout (`init_process_group(timeout=...)`, 30 minutes by default for gloo) with an error on some rank;
# here the job is stopped after `hang_timeout` seconds and each rank's Python stack says where it waited:
# rank 0 in the barrier after its loop, rank 1 in its extra `backward()`.

# %% uneven-inputs-hang
import nbddp

def uneven_loop():
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3 + rank):                   # rank r has 3 + r batches
        opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
    dist.barrier()                                 # e.g. before rank 0 saves a checkpoint
    dist.destroy_process_group()

if world_size > 1:
    try:
        nbddp.run(uneven_loop, n=world_size, timeout=hang_timeout, sinks=[])
        raise AssertionError("expected the uneven loop to hang")
    except nbddp.DDPTimeout as exc:
        without_join = exc.result
    for r in without_join.ranks:
        print(f"without Join, rank {r.rank}: {r.state}; blocked at {r.blocked_at}")

# %% uneven-inputs-join [markdown]
# The same loop inside `with Join([model]):` finishes: a rank that ran out of data keeps answering the
# others' all-reduces, with zeros, until all are done. By default the sum is still divided by the **initial**
# world size, so a step that only the late rank takes moves it by 1/N of its own gradient;
# `Join([model], divide_by_initial_world_size=False)` divides by the ranks still training instead (torch 2.13,
# `DistributedDataParallel.join_hook` in `torch/nn/parallel/distributed.py`). Below, the last rank compares
# the gradient of its lone last step with the one its own batch gives, under both settings.

# %% uneven-inputs-join-ddp
# %%ddp -n $world_size --timeout 60 --pull steps,weights,alone
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.join import Join
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = 3 + rank                                   # rank r has 3 + r batches
alone = {}                                         # last rank: DDP's gradient / its own, on its lone last step
for divide in (True, False):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model], divide_by_initial_world_size=divide):
        for step in range(steps):
            x = torch.randn(8, 4)
            own = copy.deepcopy(model.module); own(x).pow(2).mean().backward()   # this rank's batch only
            opt.zero_grad(); model(x).pow(2).mean().backward()
            if rank == world - 1 and step == steps - 1:                          # every other rank has joined
                alone[f"divide_by_initial_world_size={divide}"] = (model.module.weight.grad / own.weight.grad).mean().item()
            opt.step()
    dist.barrier()                                 # e.g. before rank 0 saves a checkpoint
    if divide:
        weights = model.module.weight.sum().item()
    del model
print(f"rank {rank}: {steps} steps, weight sum {weights:.6f}" + (f"; lone last step, DDP's gradient / its own: {alone}" if alone else ""))
dist.destroy_process_group()

# %% check [markdown]
# ## Check

# %% check-code
assert all(b["max |DDP - by hand|"] < 1e-6 for b in by_hand), by_hand      # by hand == DDP, on every rank
assert len({round(b["weight sum"], 6) for b in by_hand}) == 1, by_hand      # and the replicas agree
if world_size > 1:                                                           # --diff: every parameter, on ranks 1..
    others = "rank 1" if world_size == 2 else f"ranks 1–{world_size - 1}"
    rows = [line.split() for line in diverged.splitlines()[1:]]
    assert diverged.startswith(f"--diff mine: 4 of 4 tensors differ across the {world_size} ranks"), diverged
    assert [r[0] for r in rows] == ["mine.0.weight", "mine.0.bias", "mine.2.weight", "mine.2.bias"], diverged
    assert all(" ".join(r[1:3]) == others and "max abs diff" in " ".join(r) for r in rows), diverged
    assert all(float(r[r.index("diff") + 1]) > 0 for r in rows), diverged
assert fixed == f"--diff mine: all {world_size} ranks equal (4 tensors)", fixed  # after the broadcast
plain, one, many = (timeline[k]["events"] for k in ("DDP(model)", "bucket_cap_mb=25", "bucket_cap_mb=0.25"))
layer = 256 * 256 + 256                                                     # one Linear's parameters
assert [(kind, n) for kind, _, n, _ in plain] == [("bucket", 4 * layer), ("last grad", 0), ("bucket", 2 * layer)], plain
assert [kind for kind, *_ in one] == ["last grad", "bucket"], one           # cap 25 given: one bucket, after backward
buckets = [e for e in many if e[0] == "bucket"]
last_grad = [ms for kind, _, _, ms in many if kind == "last grad"][0]
assert len(buckets) == 6 and [i for _, i, _, _ in buckets] == list(range(6)), many
assert sum(ms < last_grad for _, _, _, ms in buckets) >= 4, many           # launched while backward still ran
assert unused["default"].startswith("Expected to have finished reduction in the prior iteration"), unused
assert "head_b.grad is None" in unused["find_unused_parameters=True"], unused
for b in bn:
    assert "SyncBatchNorm" in b["torch on CPU"] and "GPU" in b["torch on CPU"], b
    assert b["|synced - whole batch|"] < 1e-4 and b["|local BN - whole batch|"] > 0.1, b
if world_size > 1:
    assert without_join.timed_out and any("backward" in (r.blocked_at or "") for r in without_join.ranks)
assert steps == [3 + r for r in range(world_size)] and len({round(w, 6) for w in weights}) == 1, (steps, weights)
if world_size > 1:                          # Join's default divides by the initial world size; False: by the ranks left
    assert abs(alone[-1]["divide_by_initial_world_size=True"] - 1 / world_size) < 1e-5, alone
    assert abs(alone[-1]["divide_by_initial_world_size=False"] - 1) < 1e-5, alone
print("ok: DDP by hand == DDP; buckets overlap backward; unused parameters, BatchNorm statistics and uneven "
      "inputs behave as described")

# %% exercise [markdown]
# ## Exercise
# DDP's comm hooks can change how a bucket is sent. Write a hook that all-reduces each bucket in
# **bfloat16** (half the bytes) and divides by the world size, register it, and compare the gradients with
# DDP's default ones on the same model and data: how far apart are they?
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your comm hook here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull gap
# where each rank sets `gap` to the largest relative difference between the two models' gradients.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull gap
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def bf16_average(state, bucket):
    half = bucket.buffer().to(torch.bfloat16)
    fut = dist.all_reduce(half, async_op=True).get_future()
    def back(f):
        out = bucket.buffer()
        out.copy_(f.value()[0].to(out.dtype) / world)
        return out
    return fut.then(back)

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
plain, compressed = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))
compressed.register_comm_hook(None, bf16_average)
x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
for model in (plain, compressed):
    model(x).pow(2).mean().backward()
gap = max(((a.grad - b.grad).abs().max() / a.grad.abs().max()).item()
          for a, b in zip(plain.parameters(), compressed.parameters()))
print(f"rank {rank}: largest relative difference {gap:.2e} (bfloat16 keeps ~2-3 significant digits)")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "gap" in globals(), "✗ nothing to check yet: your cell should end with --pull gap"
assert all(g > 1e-4 for g in gap), f"✗ the gradients differ by only {min(gap):.1e}, less than bfloat16's rounding (8 significant bits: up to 2^-8 ≈ 4e-3 of each value): is the hook registered, and does it all-reduce a bfloat16 copy of the bucket?"
assert all(g < 2e-2 for g in gap), f"✗ the gradients differ by up to {max(gap):.2e}: divide the sum by the world size, and copy it back into the bucket's buffer"
print(f"✓ close, not equal: bfloat16 rounding moves the gradients by at most {max(gap):.2e}")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull gap
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def bf16_average(state, bucket):
    half = bucket.buffer().to(torch.bfloat16)
    fut = dist.all_reduce(half, async_op=True).get_future()
    def back(f):
        out = bucket.buffer()
        out.copy_(f.value()[0].to(out.dtype))        # the sum: the division by the world size forgotten
        return out
    return fut.then(back)

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
plain, compressed = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))
compressed.register_comm_hook(None, bf16_average)
x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
for model in (plain, compressed):
    model(x).pow(2).mean().backward()
gap = max(((a.grad - b.grad).abs().max() / a.grad.abs().max()).item()
          for a, b in zip(plain.parameters(), compressed.parameters()))
print(f"rank {rank}: largest relative difference {gap:.2e} (bfloat16 keeps ~2-3 significant digits)")
dist.destroy_process_group()
# expect: ✗ the gradients differ by up to

# %% mistake-float32 tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull gap
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def bf16_average(state, bucket):
    half = bucket.buffer()                   # still float32: nothing is compressed
    fut = dist.all_reduce(half, async_op=True).get_future()
    def back(f):
        out = bucket.buffer()
        out.copy_(f.value()[0].to(out.dtype) / world)
        return out
    return fut.then(back)

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
plain, compressed = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))
compressed.register_comm_hook(None, bf16_average)
x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
for model in (plain, compressed):
    model(x).pow(2).mean().backward()
gap = max(((a.grad - b.grad).abs().max() / a.grad.abs().max()).item()
          for a, b in zip(plain.parameters(), compressed.parameters()))
print(f"rank {rank}: largest relative difference {gap:.2e} (bfloat16 keeps ~2-3 significant digits)")
dist.destroy_process_group()
# expect: ✗ the gradients differ by only
