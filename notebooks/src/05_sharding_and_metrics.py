# %% title [markdown]
# # 05 · Sharding and metrics (数据分片与指标同步)
#
# `DistributedSampler` splits a data set over the ranks: rank *r* gets indices `r, r+world, r+2·world, …`
# (after an optional shuffle that is the same on every rank for a given `seed` and epoch).
# When the length does not divide evenly:
# - `drop_last=False` (default): the list is **padded** by repeating the first indices, so every rank gets
#   `ceil(N / world)` samples — some samples are seen twice;
# - `drop_last=True`: the tail is **dropped**, every rank gets `floor(N / world)`.
#
# Equal shard sizes matter: every rank must do the same number of steps, or the DDP all-reduces do not pair
# up and the job hangs.

# %% parameters tags=["parameters"]
world_size = 2
N = 11

# %% load-ext
# %load_ext nbddp

# %% who-gets-which-index [markdown]
# ## 1 · Who gets which index

# %% who-gets-which-index-ddp
# %%ddp -n $world_size --timeout 60 --pull rows,shuffled -- $N
import os, sys
from torch.utils.data import DistributedSampler
N = int(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rows, shuffled = [], []
for drop_last in (False, True):       # num_replicas/rank given: no process group needed
    s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
    rows.append({"drop_last": drop_last, "rank": rank, "indices": list(s)})
s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=0)
for epoch in (0, 1):
    s.set_epoch(epoch)
    shuffled.append({"epoch": epoch, "rank": rank, "indices": list(s)})

# %% who-gets-which-index-code
import math
rows = [row for per_rank in rows for row in per_rank]            # --pull: one list per rank, joined
shuffled = [row for per_rank in shuffled for row in per_rank]
for row in sorted(rows, key=lambda r: (r["drop_last"], r["rank"])):
    print(f"drop_last={row['drop_last']!s:5}  rank {row['rank']}: {row['indices']}")
for row in sorted(shuffled, key=lambda r: (r["epoch"], r["rank"])):
    print(f"shuffle epoch {row['epoch']}  rank {row['rank']}: {row['indices']}")

# %% who-gets-which-index-code-2
padded = [i for r in rows if not r["drop_last"] for i in r["indices"]]
dropped = [i for r in rows if r["drop_last"] for i in r["indices"]]
assert all(len(r["indices"]) == math.ceil(N / world_size) for r in rows if not r["drop_last"])
assert set(padded) == set(range(N)) and len(padded) - N == math.ceil(N / world_size) * world_size - N
assert all(len(r["indices"]) == N // world_size for r in rows if r["drop_last"]) and len(set(dropped)) == len(dropped)
for epoch in (0, 1):   # each epoch: a partition of all indices, and a different one per epoch
    assert set(i for r in shuffled if r["epoch"] == epoch for i in r["indices"]) == set(range(N))
e0 = {r["rank"]: r["indices"] for r in shuffled if r["epoch"] == 0}
e1 = {r["rank"]: r["indices"] for r in shuffled if r["epoch"] == 1}
assert e0 != e1, "set_epoch changes the order"
print(f"padding repeated {len(padded) - N} sample(s); drop_last dropped {N - len(dropped)}")

# %% validation-metrics-rank-0 [markdown]
# ## 2 · Validation metrics: rank 0 alone is wrong
# Each rank evaluates only its shard. Printing rank 0's accuracy reports **a part** of the data. Sum the
# counts with `all_reduce` instead — and for exact numbers, evaluate an *unpadded* split (uneven is fine for
# evaluation: one all-reduce at the end, not one per step).
#
# Here sample *i* is predicted correctly unless `i % 4 == 0`.

# %% validation-metrics-rank-0-ddp
# %%ddp -n $world_size --timeout 60 --pull got@0 -- $N
import sys, torch, torch.distributed as dist
from torch.utils.data import DistributedSampler
dist.init_process_group("gloo")
N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
correct = lambda idx: torch.tensor([float(i % 4 != 0) for i in idx])

padded = list(DistributedSampler(range(N), shuffle=False))         # the training sampler, reused
exact = list(range(rank, N, world))                                # unpadded, uneven split
c = correct(padded)
got = {"RANK0_ONLY": c.mean().item()}                               # what rank 0 alone would report
stats = torch.tensor([c.sum().item(), len(padded)]); dist.all_reduce(stats)
got["ALLREDUCE_PADDED"] = (stats[0] / stats[1]).item()
stats = torch.tensor([correct(exact).sum().item(), len(exact)]); dist.all_reduce(stats)
got["ALLREDUCE_EXACT"] = (stats[0] / stats[1]).item()
if rank == 0: print(got, f"(exact split: {int(stats[1])} samples)")
dist.destroy_process_group()

# %% check [markdown]
# ## Check

# %% check-code
truth = sum(i % 4 != 0 for i in range(N)) / N
assert abs(got["ALLREDUCE_EXACT"] - truth) < 1e-6, (got, truth)
if world_size > 1:
    assert abs(got["RANK0_ONLY"] - truth) > 1e-3, "rank 0 alone saw only part of the data"
if N % world_size:
    assert abs(got["ALLREDUCE_PADDED"] - truth) > 1e-3, "padding counted repeated samples twice"
print(f"true accuracy {truth:.4f}; rank 0 only {got['RANK0_ONLY']:.4f}; all_reduce over padded shards "
      f"{got['ALLREDUCE_PADDED']:.4f}; all_reduce over an exact split {got['ALLREDUCE_EXACT']:.4f}")

# %% exercise [markdown]
# ## Exercise
# Average a **loss** over ranks whose shards have different sizes (`range(rank, N, world)`). Why is
# `all_reduce(mean_loss) / world` wrong, and what is right? Compute both against the true mean of `(i * 0.1) ** 2`
# over `i < N`.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your two averages here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull naive@0,weighted@0 -- $N
# `naive`: all_reduce of each rank's mean loss / world; `weighted`: all_reduce of the sum and of the count.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull naive@0,weighted@0 -- $N
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
losses = torch.tensor([(i * 0.1) ** 2 for i in range(rank, N, world)])
naive = losses.mean().clone(); dist.all_reduce(naive); naive = naive.item() / world   # mean of means: wrong weights
s = torch.tensor([losses.sum().item(), float(len(losses))]); dist.all_reduce(s)      # sum and count: right
weighted = (s[0] / s[1]).item()
if rank == 0:
    print(f"naive {naive:.6f} weighted {weighted:.6f}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "weighted" in globals() and "naive" in globals(), "✗ nothing to check yet: your cell should end with --pull naive@0,weighted@0"
assert N % world_size, f"✗ N = {N} splits evenly over {world_size} ranks: equal shards make the mean of means the true mean, so nothing here can tell them apart: run the lesson with an N that is not a multiple of world_size"
true_mean = sum((i * 0.1) ** 2 for i in range(N)) / N
shard_means = [sum((i * 0.1) ** 2 for i in range(r, N, world_size)) / len(range(r, N, world_size)) for r in range(world_size)]
mean_of_means = sum(shard_means) / world_size
if abs(weighted - true_mean) >= 1e-5:
    assert abs(weighted - mean_of_means) >= 1e-5, f"✗ `weighted` is {weighted:.6f}, the mean of the ranks' means, not the true mean {true_mean:.6f}: shards of {[len(range(r, N, world_size)) for r in range(world_size)]} samples must count by their size: all_reduce the sum of the losses and their count, then divide"
    assert abs(weighted - shard_means[0]) >= 1e-5, f"✗ `weighted` is {weighted:.6f}, rank 0's own mean, not the true mean {true_mean:.6f}: all_reduce the sum of the losses and their count over all ranks, then divide"
    raise AssertionError(f"✗ `weighted` is {weighted:.6f}, the true mean {true_mean:.6f}: all_reduce the sum of the losses and their count, then divide")
assert abs(naive - mean_of_means) < 1e-5, f"✗ `naive` is {naive:.6f}, not the mean of the ranks' means {mean_of_means:.6f}: all_reduce each rank's mean loss, then divide by the world size"
print(f"✓ naive {naive:.6f} (shards of different sizes weigh the same), weighted {weighted:.6f} = true {true_mean:.6f}")

# %% mistake-mean-of-means tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull naive@0,weighted@0 -- $N
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
losses = torch.tensor([(i * 0.1) ** 2 for i in range(rank, N, world)])
naive = losses.mean().clone(); dist.all_reduce(naive); naive = naive.item() / world
mean = losses.mean().clone(); dist.all_reduce(mean)
weighted = mean.item() / world                    # the mean of the means again: each rank counts the same
dist.destroy_process_group()
# expect: ✗ `weighted` .* the mean of the ranks' means

# %% mistake-rank0-only tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull naive@0,weighted@0 -- $N
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
losses = torch.tensor([(i * 0.1) ** 2 for i in range(rank, N, world)])
naive = losses.mean().clone(); dist.all_reduce(naive); naive = naive.item() / world
weighted = losses.sum().item() / len(losses)       # sum and count, but of this rank's shard only
dist.destroy_process_group()
# expect: ✗ `weighted` .* rank 0's own mean
