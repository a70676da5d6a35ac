# %% title [markdown]
# # 15 · Scaling: throughput vs ranks, the cost of communication, the learning rate
#
# Data parallelism promises *N* times the samples per second on *N* devices. What it delivers is
#
# &nbsp;&nbsp;&nbsp;&nbsp;step time ≈ compute(per-rank batch) + the part of the all-reduce that backward did not hide,
#
# and the all-reduce grows with the **model** (every gradient, every step), not with the batch: a ring
# all-reduce sends about 2·(N−1)/N × the gradients' bytes from every rank (lesson 03). So a model with much
# compute per parameter scales well, and one with little (a wide, shallow layer; a small batch per rank) does
# not. And devices must really be there: ranks that share cores only take turns. This lesson measures the
# parts on this CPU machine (the work per rank, the communication; the speed-up itself needs a core per rank
# that nothing else uses, which a shared 2-core machine cannot promise), draws one DDP step as a timeline, and
# ends with what a larger global batch does to the learning rate.
#
# Every model trains on `nbddp.datasets.digits()`: 1,797 real handwritten digits (8×8 pixels, 10 classes).

# %% parameters tags=["parameters"]
world_size = 2
rank_counts = [1, 2, 4]
steps = 30
repeats = 5
epochs = 3

# %% load-ext
# %load_ext nbddp
import os
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"this machine gives the notebook {cores} CPU cores")
if hasattr(os, "getloadavg"):   # timings are only as good as the machine is quiet
    print(f"load average {os.getloadavg()[0]:.1f}: processes wanting a core, on average, over the last minute")

# %% throughput [markdown]
# ## 1 · Weak scaling: the work per rank, the cost of communication
# One function, run as a job on 1, 2 and 4 ranks (`nbddp.run(fn, n=...)` returns each rank's return value).
# Each rank uses **one** thread (`torch.set_num_threads(1)`: a rank is one core, as a rank is one GPU), takes
# a batch of 32 digits per step (so the global batch grows with the ranks: *weak scaling*), and measures two
# models: a **small** MLP (64→96→10, 7 K parameters, 28 KB of gradients) and a **wide** one
# (64→512→512→512→10, 0.56 M parameters, 2.15 MiB). For each it times, after warm-up steps,
# - `steps` steps under `no_sync()` (no all-reduce): the compute, as **CPU time** of the rank's thread
#   (`time.thread_time()`: the work it did; the least of `repeats` runs, as a busy machine only adds to it:
#   cache misses after another process ran on the core, a core slowed by busy neighbours) and as **wall
#   time** (what it took, waiting for a core included; the median of the runs);
# - the same steps as real DDP steps (wall time);
# - one `all_reduce` of all the gradients, alone: the communication. It is the fastest of 30, the two
#   models' all-reduces taken in turn, so both meet the same load.
#
# **What this machine cannot show** is the speed-up itself. N ranks give N× the samples per second only when
# each rank has a device (here: a core) of its own for the whole run. The machines these lessons are tested
# on have 2 cores (the top of the lesson prints this one's), and other programs may use them too, so a 2-rank
# job may get close to 2× or not at all, and 4 ranks on 2 cores cannot get it. The job's throughput is printed below for what it is, one reading of a shared machine; the
# lesson asserts only what holds however busy the machine is.

# %% throughput-code
import nbddp

def measure(steps, repeats):
    import statistics, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from nbddp.datasets import digits
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = digits("train")
    batches = [(X[i:i + 32], y[i:i + 32]) for i in range(rank * 32, len(X) - 32, world * 32)]
    widths = {"small": [64, 96, 10], "wide": [64, 512, 512, 512, 10]}
    out, grads = {}, {}
    for name, w in widths.items():
        torch.manual_seed(0)
        layers = [m for a, b in zip(w, w[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())][:-1]
        model = DDP(torch.nn.Sequential(*layers))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        def train(n, sync):
            for i in range(n):
                xb, yb = batches[i % len(batches)]
                opt.zero_grad()
                if sync:
                    torch.nn.functional.cross_entropy(model(xb), yb).backward()
                else:
                    with model.no_sync():
                        torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        train(3, True); train(3, False)                  # warm up, outside the timing
        wall, cpu, step = [], [], []
        for _ in range(repeats):
            dist.barrier(); t0, c0 = time.perf_counter(), time.thread_time()
            train(steps, False)                          # compute only
            wall.append(time.perf_counter() - t0); cpu.append(time.thread_time() - c0)
            dist.barrier(); t0 = time.perf_counter()
            train(steps, True)                           # real DDP steps
            step.append(time.perf_counter() - t0)
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
        seen = torch.tensor([float(steps * 32)]); dist.all_reduce(seen)      # samples of one run, all ranks
        out[name] = {"samples_per_step": 32, "job_samples": seen.item(),
                     "cpu_ms": min(cpu) / steps * 1e3, "wall_ms": statistics.median(wall) / steps * 1e3,
                     "step_ms": statistics.median(step) / steps * 1e3, "grad_mb": grads[name].numel() * 4 / 2**20}
        out[name]["job_samples_per_s"] = seen.item() / statistics.median(step)
        del model, opt                   # DDP before its process group
    reduce_s = {name: [] for name in grads}
    for _ in range(30):                  # small, wide, small, wide, ...: the same moments for both
        for name, g in grads.items():
            dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(g); reduce_s[name].append(time.perf_counter() - t0)
    for name in grads:
        out[name]["allreduce_ms"] = min(reduce_s[name]) * 1e3
    dist.destroy_process_group()
    return out

scaling = {n: nbddp.run(measure, n=n, args=(steps, repeats), timeout=120, sinks=[]).values for n in rank_counts}
for name in ("small", "wide"):
    for n, per_rank in scaling.items():
        m = per_rank[0][name]
        print(f"{name:5} ({m['grad_mb']:.2f} MiB of gradients), {n} rank(s), rank 0: compute {m['cpu_ms']:5.2f} ms CPU "
              f"in {m['wall_ms']:5.2f} ms wall per step; all-reduce alone {m['allreduce_ms']:5.2f} ms; "
              f"a DDP step {m['step_ms']:5.2f} ms; the job: {m['job_samples_per_s']:6.0f} samples/s")

# %% throughput-plot
import matplotlib.pyplot as plt
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8))
labels, x = [], 0
for name in ("small", "wide"):
    for n in rank_counts:
        m = scaling[n][0][name]
        a.bar(x - 0.2, m["cpu_ms"], width=0.4, color="C0", label="CPU time (the work)" if x == 0 else None)
        a.bar(x + 0.2, m["wall_ms"], width=0.4, color="C1", label="wall time (the wait for a core too)" if x == 0 else None)
        labels.append(f"{name}\n{n} rank{'s' * (n > 1)}"); x += 1
a.set_xticks(range(len(labels)), labels, fontsize=8); a.set_yscale("log"); a.set_ylabel("ms per step, rank 0 (log)")
a.legend(fontsize=8); a.set_title(f"compute per step and rank: the same work at every N ({cores} cores)")
for i, name in enumerate(("small", "wide")):
    counts = [n for n in rank_counts if n > 1]
    b.plot(counts, [scaling[n][0][name]["allreduce_ms"] for n in counts], "o-", color=f"C{i + 2}",
           label=f"{name}: {scaling[1][0][name]['grad_mb']:.2f} MiB of gradients")
b.set_xticks(counts); b.set_xlabel("ranks"); b.set_ylim(0); b.set_ylabel("all_reduce of the gradients (ms)")
b.legend(fontsize=8); b.set_title("at each N, the wide model's all-reduce costs more")
fig.tight_layout(); plt.show()

# %% throughput-assert
small = {n: scaling[n][0]["small"] for n in rank_counts}
wide = {n: scaling[n][0]["wide"] for n in rank_counts}
for n, per_rank in scaling.items():        # weak scaling: 32 samples per rank and step, N × 32 for the job
    assert len(per_rank) == n and all(v[m]["job_samples"] == n * steps * 32 for v in per_rank for m in v), (n, per_rank)
for n in rank_counts:                      # the same work per rank at every N (CPU time: within 2× for the wide
    assert 0.5 < wide[n]["cpu_ms"] / wide[1]["cpu_ms"] < 2, (n, wide)      # model, 3× for the small one's short runs)
    assert 0.33 < small[n]["cpu_ms"] / small[1]["cpu_ms"] < 3, (n, small)
if cores <= 2 and 4 in rank_counts:        # 4 ranks on 2 cores take turns: wall time >= 1.4 × the work
    assert all(v["wide"]["wall_ms"] > 1.4 * v["wide"]["cpu_ms"] for v in scaling[4]), scaling[4]
for n in [n for n in rank_counts if n > 1]:  # 78× the bytes, at every N
    assert wide[n]["allreduce_ms"] > small[n]["allreduce_ms"], (n, small[n], wide[n])
if cores <= 2 and {2, 4} <= set(rank_counts):  # 2 → 4 ranks: more than the ring's 1.5× of bytes per rank
    assert wide[4]["allreduce_ms"] > 1.5 * wide[2]["allreduce_ms"], (wide[2], wide[4])
assert wide[1]["cpu_ms"] > 3 * small[1]["cpu_ms"], (small[1], wide[1])
print("as the text says: the same work per rank at every world size; with 4 ranks on", cores, "cores a rank's "
      f"step takes {min(v['wide']['wall_ms'] / v['wide']['cpu_ms'] for v in scaling[4]):.1f}× its CPU time or more; "
      f"the wide model's all-reduce {wide[2]['allreduce_ms']:.2f} ms vs the small one's {small[2]['allreduce_ms']:.2f} ms on 2 ranks, "
      f"{wide[4]['allreduce_ms'] / wide[2]['allreduce_ms']:.1f}× as long on 4 (the ring's bytes: 1.5×)")

# %% throughput-reading [markdown]
# How to read it. **Left**: a rank's CPU time per step is the same on 1, 2 and 4 ranks: weak scaling keeps each
# rank's work constant and multiplies the job's samples per step by N. The wall time is that work plus the
# time the rank waited for a core: on **4 ranks with 2 cores** the ranks take turns, and a step takes well
# over its CPU time (about twice on an otherwise idle machine, each rank getting half a core; more when
# other programs run; the assert asks for 1.4× at least); even on 1 or 2 ranks the wall time exceeds the CPU time whenever other programs
# want the same cores. A speed-up needs the second bar (wall) to stay as low as the first (CPU), on every rank,
# at once.
# **Right**: the all-reduce moves every gradient every step, so its cost follows the **model**: at each N the
# wide model's 2.15 MiB cost more than the small one's 28 KB, whatever the batch. Along the x-axis both lines
# climb, and under weak scaling the x-axis is also the global batch; but the all-reduce moves the same
# gradients whatever the batch: what changes is the number of ranks. A ring all-reduce sends 2·(N−1)/N × the
# bytes from each rank (1× on 2 ranks, 1.5× on 4), in more and smaller messages as N grows (gloo's ring,
# `gloo/allreduce.cc`, cuts the buffer into at least 2·N segments; the small model's few KB are mostly the
# messages' latency). The climb from 2 to 4 ranks is steeper than those 1.5× of bytes (the assert asks it of
# the wide model): more messages, and 4 processes taking turns on 2 cores. (It is measured alone here, the
# fastest of 30: the cost of the bytes. A real DDP step, printed above, is often longer than compute plus that
# on a busy machine: a rank that waits for its peer sleeps, and the OS wakes it late. On free cores
# backward hides part of the all-reduce instead, section 2.) The small model's CPU times are short (a few
# milliseconds per run) and so noisier than the wide one's.
#
# On real hardware the same two quantities decide: a model with much compute per parameter scales well; one
# with little (a wide, shallow layer; a small batch per rank), or a slow interconnect (PCIe instead of
# NVLink, Ethernet between nodes), does not. The cure is fewer, larger all-reduces (`no_sync()`
# accumulation, lesson 08; larger buckets), more compute per step (a larger per-rank batch), or sharding
# (FSDP, lesson 14) when memory, not speed, is the limit. Measure speed-ups on devices that nothing else
# uses, several times.

# %% timeline [markdown]
# ## 2 · One DDP step, as a timeline
# The wide model on `world_size` ranks, with `bucket_cap_mb=0.25` so its gradients travel in several buckets (a 512×512 layer is 1 MiB).
# Each rank records, against one clock (`time.time()` after a barrier: both ranks run on this machine), when
# forward, backward and `opt.step()` start and end, when the last gradient of backward (the first layer's
# weight, a hook on it as in lesson 12) is ready, and, through a communication hook (lesson 12), when each
# bucket's all-reduce is launched and when it completes.

# %% timeline-ddp
# %%ddp -n $world_size --timeout 90 --pull events
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from nbddp.datasets import digits
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
X, y = digits("train")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)), bucket_cap_mb=0.25)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
events = []

def timed_average(state, bucket):
    started = time.time()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    def done(f):
        events.append(("all-reduce", f"bucket {bucket.index()}", started, time.time()))
        return f.value()[0] / world
    return fut.then(done)
model.register_comm_hook(None, timed_average)
model.module[0].weight.register_hook(lambda g: events.append(("mark", "last gradient ready", time.time(), time.time())))

for step in range(4):                     # the last step is drawn; the first ones settle the buckets
    xb, yb = X[(2 * step + rank) * 32:][:32], y[(2 * step + rank) * 32:][:32]
    events.clear()
    dist.barrier()
    t = time.time(); out = model(xb); loss = torch.nn.functional.cross_entropy(out, yb)
    events.append(("compute", "forward", t, time.time()))
    t = time.time(); opt.zero_grad(); loss.backward()
    events.append(("compute", "backward", t, time.time()))
    t = time.time(); opt.step()
    events.append(("compute", "opt.step", t, time.time()))
compute = {what: (start, end) for kind, what, start, end in events if kind == "compute"}
last_launch = max(start for kind, _, start, _ in events if kind == "all-reduce")
print(f"rank {rank}: forward {(compute['forward'][1] - compute['forward'][0]) * 1e3:.1f} ms, loss.backward() "
      f"{(compute['backward'][1] - compute['backward'][0]) * 1e3:.1f} ms (computing until the last bucket's launch "
      f"{(last_launch - compute['backward'][0]) * 1e3:.1f} ms, then waiting {(compute['backward'][1] - last_launch) * 1e3:.1f} ms), "
      f"opt.step {(compute['opt.step'][1] - compute['opt.step'][0]) * 1e3:.1f} ms")
del model
dist.destroy_process_group()

# %% timeline-plot
t0 = min(start for per_rank in events for _, _, start, _ in per_rank)
colors = {"forward": "C0", "backward": "C1", "opt.step": "C2"}
rows = []                                   # per rank: its compute, then one row per bucket
for r, per_rank in enumerate(events):
    rows += [(r, "compute")] + sorted({(r, what) for kind, what, *_ in per_rank if kind == "all-reduce"})
fig, ax = plt.subplots(figsize=(12, 0.8 + 0.42 * len(rows)))
ms = lambda t: (t - t0) * 1e3
for r, per_rank in enumerate(events):
    last_launch = max(start for kind, _, start, _ in per_rank if kind == "all-reduce")
    for kind, what, start, end in per_rank:
        row = rows.index((r, "compute" if kind != "all-reduce" else what))
        if kind == "mark":                  # the first layer's weight: backward's last gradient
            ax.plot(ms(start), row, "v", color="k", markersize=8)
        elif what == "backward":            # computing until the last bucket is launched, then waiting for the buckets
            ax.barh(row, ms(last_launch) - ms(start), left=ms(start), height=0.7, color="C1", edgecolor="k", alpha=0.85)
            ax.barh(row, ms(end) - ms(last_launch), left=ms(last_launch), height=0.7, color="C1", edgecolor="k",
                    alpha=0.3, hatch="//")
        else:
            ax.barh(row, ms(end) - ms(start), left=ms(start), height=0.7, color=colors.get(what, "C3"),
                    edgecolor="k", alpha=0.85)
ax.set_yticks(range(len(rows)), [f"rank {r} {what}" + (" all-reduce" if what != "compute" else "") for r, what in rows],
              fontsize=8)
ax.invert_yaxis(); ax.set_xlabel("ms since the step began")
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="C0", alpha=0.85), plt.Rectangle((0, 0), 1, 1, color="C1", alpha=0.85),
                   plt.Rectangle((0, 0), 1, 1, facecolor="C1", alpha=0.3, hatch="//", edgecolor="k"),
                   plt.Rectangle((0, 0), 1, 1, color="C2", alpha=0.85), plt.Rectangle((0, 0), 1, 1, color="C3", alpha=0.85),
                   plt.Line2D([], [], marker="v", color="k", linestyle="none")],
          labels=["forward", "loss.backward(): computing gradients", "loss.backward(): waiting for the buckets",
                  "opt.step", "a bucket's all-reduce (launched → done)", "last gradient ready"],
          fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.28))
ax.set_title("one DDP step: the first buckets all-reduce while backward still computes; backward then waits for the rest")
fig.tight_layout(); plt.show()

# %% timeline-reading [markdown]
# Backward computes the **last** layer's gradients first; as soon as a bucket is full, DDP launches its
# all-reduce, and backward goes on with the earlier layers meanwhile: every bucket but the last is launched
# before the last gradient (▼) is ready (the check below asserts it). Backward's computing ends when the last
# bucket is launched, right after that gradient; the rest of the `loss.backward()` call (hatched) is waiting
# for the all-reduces to finish and for their averages to be written to `.grad`: communication that nothing
# hid, as nothing is left to compute behind it (the check asserts that every all-reduce ended before
# `loss.backward()` returned). `opt.step()` then runs on gradients that are the same on every rank. Ranks that start a step at
# different times (one slower core, one larger batch, a rank the OS did not run for a while) meet in every
# all-reduce: a bucket's all-reduce cannot end on any rank before the last rank has launched it (the check
# below asserts it for every bucket), so the earlier rank waits there. How long each bar looks on a busy
# machine also depends on when the OS lets each rank record the end: read the order, not the lengths.

# %% lr [markdown]
# ## 3 · The learning rate when the global batch grows
# With DDP the **global** batch is per-rank batch × ranks: each step averages more samples, and an epoch
# has fewer steps. Keeping the single-device learning rate, the model takes as many steps fewer and learns
# less per epoch. The **linear scaling rule** (Goyal et al., 2017, "ImageNet in 1 hour") multiplies the
# learning rate by the growth of the global batch, with a warm-up of a few epochs at large factors; it
# holds for SGD up to a point (it breaks down for very large batches), and for Adam a √k factor is the
# common starting point.
#
# The baseline: one device, batch 16, `lr=0.1`, in the notebook. Then a job on `world_size` ranks with
# 128 // `world_size` per rank (64 on 2 ranks) — a global batch of 128, 8× larger (the same as 8 GPUs with 16 each) — trains twice: with the
# baseline's `lr` and with `8 × lr`.

# %% lr-single
import torch
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
torch.set_num_threads(1)      # a model this small runs fastest on one thread (and on a busy machine, much)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train = TensorDataset(*digits("train"))
order = DistributedSampler(train, num_replicas=1, rank=0, seed=0)
baseline = []
for epoch in range(epochs):
    order.set_epoch(epoch)
    total = 0.0
    for xb, yb in DataLoader(train, batch_size=16, sampler=order):
        opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
        total += loss.item() * len(xb)
    baseline.append(total / len(train))
print("one device, batch 16, lr 0.1: losses", [round(l, 3) for l in baseline])

# %% lr-ddp
# %%ddp -n $world_size --timeout 90 --pull curves@0 -- --epochs $epochs --lrs 0.1 0.8
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int); parser.add_argument("--lrs", type=float, nargs="+")
args = parser.parse_args()
dist.init_process_group("gloo")
world = dist.get_world_size()
train = TensorDataset(*digits("train"))
curves = {}
for lr in args.lrs:
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = DistributedSampler(train, seed=0)
    curves[lr] = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(2)
        for xb, yb in DataLoader(train, batch_size=128 // world, sampler=sampler):
            opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
            stats += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(stats)
        curves[lr].append((stats[0] / stats[1]).item())
    if dist.get_rank() == 0:
        print(f"global batch 128, lr {lr}: losses {[round(l, 3) for l in curves[lr]]}")
    del model
dist.destroy_process_group()

# %% lr-plot
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(range(1, epochs + 1), baseline, "k-o", label="1 device, batch 16, lr 0.1")
for lr, c in zip(curves, ("C3", "C2")):
    ax.plot(range(1, epochs + 1), curves[lr], "-o", color=c, label=f"{world_size} ranks × {128 // world_size} = batch 128, lr {lr}")
ax.set_xlabel("epoch"); ax.set_ylabel("training loss (cross-entropy)"); ax.set_xticks(range(1, epochs + 1))
ax.legend(fontsize=8); ax.set_title("a global batch 8× larger needs about 8× the learning rate (SGD)")
fig.tight_layout(); plt.show()

# %% check [markdown]
# ## Check

# %% check-code
for r, per_rank in enumerate(events):
    compute = {what: (start, end) for kind, what, start, end in per_rank if kind == "compute"}
    buckets = sorted((start, end) for kind, _, start, end in per_rank if kind == "all-reduce")
    (last_grad,) = [start for kind, _, start, _ in per_rank if kind == "mark"]
    assert len(buckets) >= 3, per_rank                                            # bucket_cap_mb=0.25: several buckets
    assert all(start < last_grad for start, _ in buckets[:-1]), per_rank          # all but the last launched before
    assert last_grad <= buckets[-1][0] <= compute["backward"][1], per_rank        # the last gradient was ready
    assert max(end for _, end in buckets) <= compute["backward"][1] <= compute["opt.step"][0], per_rank  # backward waited
launched = {}                                                                     # bucket -> [(rank, start, end)]
for r, per_rank in enumerate(events):
    for kind, what, start, end in per_rank:
        if kind == "all-reduce":
            launched.setdefault(what, []).append((r, start, end))
for what, per_bucket in launched.items():     # no rank's all-reduce of a bucket ends before every rank launched it
    assert len(per_bucket) == world_size and min(e for _, _, e in per_bucket) >= max(s for _, s, _ in per_bucket), per_bucket
unscaled, scaled = curves[0.1], curves[0.8]
assert scaled[-1] < unscaled[-1], (scaled, unscaled)
assert abs(scaled[-1] - baseline[-1]) < abs(unscaled[-1] - baseline[-1]), (baseline, scaled, unscaled)
print(f"ok: {len(rank_counts)} world sizes measured (section 1); "
      f"buckets reduced during backward; last-epoch loss: baseline {baseline[-1]:.3f}, "
      f"batch 128 with lr 0.1 {unscaled[-1]:.3f}, with lr 0.8 {scaled[-1]:.3f}")

# %% exercise [markdown]
# ## Exercise
# Try the square-root rule on the same job: a global batch 8× larger with `lr = 0.1 × √8` (≈ 0.283). Where
# does its last-epoch loss land, next to the unscaled (0.1) and the linearly scaled (0.8) runs?
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your run here: the cell of section 3 again, with --lrs 0.283 and --pull sqrt_curves@0
# (rename `curves` to `sqrt_curves` in your copy, or add a line `sqrt_curves = curves`).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 90 --pull sqrt_curves@0 -- --epochs $epochs --lr 0.283
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
parser = argparse.ArgumentParser(); parser.add_argument("--epochs", type=int); parser.add_argument("--lr", type=float)
args = parser.parse_args()
dist.init_process_group("gloo")
train = TensorDataset(*digits("train"))
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)))
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
sampler = DistributedSampler(train, seed=0)
sqrt_curves = {args.lr: []}
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    stats = torch.zeros(2)
    for xb, yb in DataLoader(train, batch_size=128 // dist.get_world_size(), sampler=sampler):
        opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
        stats += torch.tensor([loss.item() * len(xb), len(xb)])
    dist.all_reduce(stats)
    sqrt_curves[args.lr].append((stats[0] / stats[1]).item())
if dist.get_rank() == 0:
    print(f"global batch 128, lr {args.lr}: losses {[round(l, 3) for l in sqrt_curves[args.lr]]}")
del model
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "sqrt_curves" in globals(), "✗ nothing to check yet: your cell should end with --pull sqrt_curves@0"
((lr, mine),) = sqrt_curves.items()
assert abs(lr - 0.1 * 8 ** 0.5) < 0.01, f"✗ the learning rate was {lr}, not 0.1 × √8 ≈ 0.283"
assert len(mine) == epochs, f"✗ {len(mine)} epochs, not {epochs}: pass --epochs $epochs"
assert scaled[-1] < mine[-1] < unscaled[-1], f"✗ its last loss {mine[-1]:.3f} is not between the linear rule's {scaled[-1]:.3f} and the unscaled {unscaled[-1]:.3f}: same model, seed, sampler and batch 128?"
print(f"✓ √k scaling lands in between: last-epoch loss {unscaled[-1]:.3f} (lr 0.1) > {mine[-1]:.3f} (lr {lr}) > {scaled[-1]:.3f} (lr 0.8)")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 90 --pull sqrt_curves@0 -- --epochs $epochs --lrs 0.141
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int); parser.add_argument("--lrs", type=float, nargs="+")
args = parser.parse_args()
dist.init_process_group("gloo")
train = TensorDataset(*digits("train"))
sqrt_curves = {}
for lr in args.lrs:                       # 0.1 × √2: the square root of the number of ranks, not of the batch's growth (8)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = DistributedSampler(train, seed=0)
    sqrt_curves[lr] = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(2)
        for xb, yb in DataLoader(train, batch_size=128 // dist.get_world_size(), sampler=sampler):
            opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
            stats += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(stats)
        sqrt_curves[lr].append((stats[0] / stats[1]).item())
    del model
dist.destroy_process_group()
# expect: ✗ the learning rate was 0\.141
