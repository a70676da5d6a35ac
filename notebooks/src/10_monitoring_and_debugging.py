# %% title [markdown]
# # 10 · Monitoring and debugging (监控与调试)
#
# With N processes there are N logs, N stacks, N profiles. Three habits:
# 1. **log to one file per rank**, and to the screen at INFO on rank 0 only (warnings from every rank);
# 2. **profile per rank** and look at communication (`all_reduce`) next to compute;
# 3. when it breaks, match the symptom to the **cheat sheet** below and do its drill;
#    when one rank computes something wrong, **stop that rank** with `breakpoint()` and look (Drill E).

# %% parameters tags=["parameters"]
world_size = 2
log_dir = "runs/10/logs"
interactive = None  # Drill E's breakpoint: None = where someone can answer it (JupyterLab yes, papermill no)

# %% load-ext
# %load_ext nbddp

# %% per-rank-log-files [markdown]
# ## 1 · Per-rank log files, a per-rank log level on screen
# `logging` writes every rank to `rank{N}.log` at INFO. On the screen, rank 0 logs at INFO and the others
# at WARNING: one readable stream, and a problem on any rank still shows. (nbddp also keeps each rank's
# full stdout/stderr in `--log-dir`; `--ranks 0` shows only rank 0 in the notebook while all ranks run.)
#
# > **Name the files by the global rank.** Many articles name them by `LOCAL_RANK`. On one node that is the
# > same number; on two nodes each has a local rank 0, and on shared storage (NFS, Lustre: the usual
# > cluster home) both write the same `rank0.log`, one over the other. `dist.get_rank()` (or `RANK`) is
# > unique in the job; put the host name in too if you like.

# %% per-rank-log-files-ddp
# %%ddp -n $world_size --timeout 60 --log-dir $log_dir/nbddp -- $log_dir
import logging, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
os.makedirs(sys.argv[1], exist_ok=True)
log = logging.getLogger("train")
log.setLevel(logging.INFO)
to_file = logging.FileHandler(f"{sys.argv[1]}/rank{rank}.log", mode="w")           # every rank, everything
to_file.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
to_screen = logging.StreamHandler(sys.stdout)
to_screen.setLevel(logging.INFO if rank == 0 else logging.WARNING)                  # the per-rank level
to_screen.setFormatter(logging.Formatter(f"rank{rank} %(levelname)s %(message)s"))
log.addHandler(to_file); log.addHandler(to_screen)
model = DDP(torch.nn.Linear(32, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    opt.zero_grad(); loss = model(torch.randn(16, 32)).pow(2).mean(); loss.backward(); opt.step()
    log.info("step %d loss %.4f", step, loss.item())
log.warning("done after %d steps", step + 1)                                       # every rank shows this
dist.destroy_process_group()

# %% per-rank-log-files-code
import glob, os
logs = sorted(glob.glob(f"{log_dir}/rank*.log"))
print(logs)
print(open(logs[-1]).read().splitlines()[-1])
assert len(logs) == world_size and all(len(open(p).read().splitlines()) == 6 for p in logs)
assert "rank0 INFO step 4" in _ddp.ranks[0].stdout
assert all(r.stdout.strip() == f"rank{r.rank} WARNING done after 5 steps" for r in _ddp.ranks[1:])
assert os.path.exists(_ddp.ranks[1].stdout_path) and _ddp.log_dir.startswith(os.path.abspath(log_dir))

# %% profiler-per-rank-find [markdown]
# ## 2 · The profiler, per rank: find the all-reduce
# `torch.profiler` inside each rank, as the article sets it up for training: a `schedule` (skip 1 step,
# warm up 1, record 2), `prof.step()` at the end of every step, and `tensorboard_trace_handler`, which
# writes each recorded window as a trace file per rank (`worker_name`) for TensorBoard's profiler plugin,
# Perfetto or `chrome://tracing`. DDP's gradient all-reduce shows up as `gloo:all_reduce` (NCCL:
# `nccl:all_reduce`) next to the compute ops. `--env KINETO_LOG_LEVEL=6` quiets the profiler library's
# own `profiler_start`/`profiler_stop` lines on stderr. The handler names each file
# `{worker_name}.{time_ns}.pt.trace.json`, so every run adds files beside the old ones: first an empty folder.

# %% profiler-per-rank-find-clear
import shutil
shutil.rmtree(f"{log_dir}/tb", ignore_errors=True)

# %% profiler-per-rank-find-ddp
# %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull comm -- $log_dir
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile, schedule, tensorboard_trace_handler, ProfilerActivity
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=tensorboard_trace_handler(f"{sys.argv[1]}/tb", worker_name=f"rank{rank}")) as prof:
    for step in range(4):
        opt.zero_grad(); model(torch.randn(64, 256)).pow(2).mean().backward(); opt.step()
        prof.step()                              # tells the schedule a step ended
events = prof.key_averages()                      # the 2 recorded ("active") steps
if rank == 0:
    print(events.table(sort_by="cpu_time_total", row_limit=8))
comm = {"events": {e.key: e.count for e in events if "all_reduce" in e.key},
        "us": sum(e.cpu_time_total for e in events if "all_reduce" in e.key)}
dist.destroy_process_group()

# %% profiler-per-rank-find-code
profiled = _ddp                                   # this job's transcripts (nbddp), for the check at the end
for rank, c in enumerate(comm):                   # --pull comm: one dict per rank
    print(f"rank {rank}: {c['events']}  ({c['us'] / 1e3:.2f} ms in all_reduce)")
traces = sorted(os.path.basename(p).split(".")[0] for p in glob.glob(f"{log_dir}/tb/*.pt.trace.json"))
print("trace files:", traces)

# %% error-cheat-sheet [markdown]
# ## 3 · Error cheat sheet (错误速查表)
#
# | symptom | likely cause | what to do | drill |
# |---|---|---|---|
# | **OOM** (`CUDA out of memory`, `can't allocate memory`) | every rank on GPU 0 (`set_device` missing; called after the first CUDA work, lesson 04; or `set_device(-1)`, a silent no-op, from a `--local_rank` default that torchrun never sets, lesson 02; why: the note below); batch too big *per rank*; rank 0 gathers everything | `torch.cuda.set_device(LOCAL_RANK)` first (and, if you like, `init_process_group(device_id=...)` too: it binds the group to the device but does not change the current one); lower the per-rank batch, accumulate (lesson 08), `bf16` | A |
# | **no speedup** with more ranks | no `DistributedSampler`: every rank trains on **all** the data; model too small: all-reduce dominates; ranks share cores (CPU) or one GPU | `DistributedSampler` + `set_epoch`; bigger per-rank work; profile (section 2) | B |
# | **wrong metrics** (accuracy differs with world size) | metric from rank 0's shard only; padded sampler counts repeats; mean of means | `all_reduce` sums and counts (lesson 05) | C |
# | **hang** (no output, 100 % or 0 % CPU) | a collective not called by all ranks, or in a different order; unequal number of batches | `--timeout` shows each rank's stack; `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch | D |
# | `RANK expected, but not set` (`MASTER_ADDR expected, but not set` once rank and world size are passed) | run with `python`, not a launcher | `torchrun` / `%%ddp` (lesson 06) | — |
# | `Address already in use` (`EADDRINUSE`) | a port still held by another job, often the default 29500 | another `--master-port`, or let it choose (lesson 06) | — |
# | `Distributed package doesn't have NCCL built in` | CPU-only torch | use gloo (lesson 09) | — |
#
# > **Why `set_device` first.** It is not that `init_process_group("nccl")` builds NCCL's communicator on the
# > current device: without `device_id=` it builds none (torch 2.13, `torch/distributed/distributed_c10d.py`:
# > initialisation is lazy), and the first collective makes it on the device of the **tensor** it is given,
# > so a tensor on `cuda:LOCAL_RANK` is on the right GPU whatever the current device is. What uses the
# > **current** device, GPU 0 until `set_device` says otherwise, is everything that names none: `.cuda()` and
# > `device="cuda"`; `dist.barrier()` without `device_ids=` on a group bound to no device (torch warns
# > "barrier(): using the device under current context"); the object
# > collectives (`all_gather_object`, `broadcast_object_list`, ...: their pickled bytes go to
# > `torch.cuda.current_device()` under NCCL); and the process's first CUDA work (a tensor, a kernel), which
# > creates a CUDA context (some hundreds of MB) on the current device. So every rank that does one of these
# > before `set_device` puts memory on GPU 0. `init_process_group(..., device_id=torch.device("cuda", local_rank))` binds the
# > group to the device instead (barrier uses it; NCCL forms its communicator at once); set the current
# > device too.

# %% drill-out-memory-rank [markdown]
# ### Drill A · out of memory: a rank fails, the others are stopped, the cause is named

# %% drill-out-memory-rank-ddp
import nbddp
try:
    get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60", "import torch\nx = torch.empty(2**50)  # 4 PiB\n")
    raise AssertionError("expected an error")
except nbddp.DDPError as exc:
    oom = exc.result.failed[0]
print(oom.describe())
assert "can't allocate memory" in oom.cause and "cell line 3" in oom.cause   # line 1 is the %%ddp line


# %% drill-b-no-speedup [markdown]
# ### Drill B · no speedup: the forgotten `DistributedSampler`, and the cost of communication
# One epoch over 2048 samples, batch 256 per rank: on 1 rank; on `world_size` ranks **without** a
# `DistributedSampler` (the plain `DataLoader` gives every rank the whole data set: each rank does the
# single-rank epoch's work, and the job is no faster, only more copies); and with it (each rank does its
# share). Each rank runs one thread (`torch.set_num_threads(1)`), trains one epoch untimed first (the
# first use of each operation is slow), then times 3 epochs, as **CPU time** of its thread
# (`time.thread_time()`: the work it did, whatever else the machine runs; the least of the 3, as a busy
# machine only adds to it) and as wall time (the median). Each rank
# also times an all-reduce of its gradients, the communication DDP adds to every step. `nbddp.run(fn, n=...)`
# runs a function as a job and returns each rank's return value in `.values`.

# %% drill-b-no-speedup-code
def one_epoch(use_sampler):
    import statistics, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 64), torch.randn(2048, 1))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedSampler(data) if use_sampler else None
    loader = DataLoader(data, batch_size=256, sampler=sampler)
    cpu, wall = [], []
    for epoch in range(4):                       # epoch 0: warm-up, not timed
        if sampler is not None:
            sampler.set_epoch(epoch)
        seen, t0, c0 = 0, time.perf_counter(), time.thread_time()
        for xb, yb in loader:
            opt.zero_grad(); torch.nn.functional.mse_loss(model(xb), yb).backward(); opt.step()
            seen += len(xb)
        if epoch:
            cpu.append(time.thread_time() - c0); wall.append(time.perf_counter() - t0)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    times = []
    for _ in range(21):
        t0 = time.perf_counter(); dist.all_reduce(grads); times.append(time.perf_counter() - t0)
    del model, opt                 # DDP first, then its process group (a DDP freed after it can hang)
    dist.destroy_process_group()
    return {"samples": seen, "epoch_cpu_s": min(cpu), "epoch_s": statistics.median(wall),
            "all_reduce_ms": statistics.median(times) * 1e3}

runs = {}
for label, n, use_sampler in (("1 rank", 1, True), (f"{world_size} ranks, no sampler", world_size, False),
                              (f"{world_size} ranks + DistributedSampler", world_size, True)):
    runs[label] = nbddp.run(one_epoch, n=n, args=(use_sampler,), timeout=60, sinks=[]).values
for label, values in runs.items():
    v = values[0]
    print(f"{label:34} rank 0: {v['samples']:5} samples, epoch {v['epoch_cpu_s']:.3f} s CPU in {v['epoch_s']:.3f} s "
          f"wall, all_reduce of the grads {v['all_reduce_ms']:.3f} ms (median)")

# %% drill-b-no-speedup-code-2
import matplotlib.pyplot as plt
labels = list(runs)
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4))
a.barh(labels, [runs[l][0]["samples"] for l in labels], color=["C0", "C3", "C2"])
a.set_xlabel("samples each rank processes per epoch"); a.invert_yaxis()
b.barh(labels, [runs[l][0]["epoch_cpu_s"] for l in labels], color=["C0", "C3", "C2"])
b.set_xlabel("one epoch's work on rank 0 (CPU seconds, least of 3)"); b.invert_yaxis(); b.set_yticks([])
fig.suptitle("Forgetting DistributedSampler: every rank repeats the whole epoch"); fig.tight_layout(); plt.show()

# %% drill-b-no-speedup-code-3
one, no_sampler, sampled = (runs[l] for l in labels)
assert all(v["samples"] == 2048 for v in one + no_sampler), "without a sampler every rank sees all 2048"
assert all(v["samples"] == 2048 // world_size for v in sampled), "with it, each rank sees its share"
if world_size > 1:
    for v in no_sampler:           # every rank repeats the whole epoch: the single rank's work, within 1.6×
        assert 1 / 1.6 < v["epoch_cpu_s"] / one[0]["epoch_cpu_s"] < 1.6, (one, no_sampler)
    for v, w in zip(sampled, no_sampler):   # with the sampler, a rank's share (1/world_size): at most 0.75 of
        assert v["epoch_cpu_s"] < 0.75 * w["epoch_cpu_s"], (no_sampler, sampled)   # the same rank's work without
    # communication is not free: the same all-reduce costs more between processes
    assert min(v["all_reduce_ms"] for v in sampled) > one[0]["all_reduce_ms"], (one, sampled)
    print(f"as the title says: without the sampler rank 0 works {no_sampler[0]['epoch_cpu_s'] / one[0]['epoch_cpu_s']:.2f}× "
          f"the single rank's epoch, with it {sampled[0]['epoch_cpu_s'] / no_sampler[0]['epoch_cpu_s']:.2f}× of that")


# %% drill-c-wrong-metrics [markdown]
# ### Drill C · wrong metrics: the metric depends on the world size

# %% drill-c-wrong-metrics-code
def metric():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    scores = torch.arange(10.0)[rank::world]                # this rank's shard of 10 samples
    s = torch.tensor([scores.sum().item(), float(len(scores))]); dist.all_reduce(s)
    dist.destroy_process_group()
    return {"this shard only": scores.mean().item(), "all_reduce": (s[0] / s[1]).item()}

got = nbddp.run(metric, n=world_size, timeout=60).values[0]      # rank 0's return value
wrong, right = got["this shard only"], got["all_reduce"]
print("rank 0 only:", wrong, "| all_reduce:", right, "| true mean:", 4.5)
assert right == 4.5 and (world_size == 1 or wrong != 4.5)

# %% drill-d-hang-made [markdown]
# ### Drill D · a hang made loud: `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch

# %% drill-d-hang-made-code
mismatch = '''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
if dist.get_rank() == 0:
    dist.all_reduce(t)
else:
    dist.broadcast(t, src=0)
'''
if world_size > 1:
    try:
        nbddp.run(mismatch, n=world_size, timeout=30, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
        raise AssertionError("expected an error")
    except nbddp.DDPError as exc:
        bad = exc.result.failed[0]
    print(bad.describe()[:300], "\nhint:", bad.hint)
    assert "mismatch between collectives" in bad.cause and "different collectives" in bad.hint

# %% drill-e-breakpoint [markdown]
# ### Drill E · one rank is wrong: stop it with `breakpoint()` and look
# Eleven samples, split over the ranks, and the all-reduced mean comes out wrong. Each rank takes
# `per = len(data) // world` samples; the bug sits on the **last** rank. Its `breakpoint()` opens
# pdb for that rank alone in the notebook's input box, the prompt naming it: `(Pdb rank 1)`.
# Type `p start, stop, len(data)` (sample 10 is in no shard), `l`, `n`, `p total`, then `c` to let
# the rank go on (`q` would stop the launch: "quit in the debugger at cell line N"). Meanwhile
# rank 0 waits for it in the all-reduce, as it would under torchrun; the header says which rank
# is in the debugger. Several ranks at breakpoints take turns. `%%ddp --pdb` opens the first
# failing rank at its failing frame instead.
#
# Where no one can answer (this lesson's papermill run) `interactive` is False and the
# breakpoint is skipped; a `breakpoint()` left in a cell there fails at once with `NoDebugger`.

# %% drill-e-breakpoint-code
if interactive is None:
    interactive = nbddp.can_answer()
print("stop at the breakpoint:", interactive)

# %% drill-e-breakpoint-ddp
# %%ddp -n $world_size --timeout 120 --push interactive --pull mean@0
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = torch.arange(11.0)                        # 11 samples: they do not split evenly
per = len(data) // world
start, stop = rank * per, (rank + 1) * per       # each rank's shard
if interactive and rank == world - 1:
    breakpoint()                                 # (Pdb rank 1) p start, stop, len(data)
total = torch.tensor([data[start:stop].sum().item(), float(stop - start)])
dist.all_reduce(total)
mean = (total[0] / total[1]).item()
dist.destroy_process_group()

# %% drill-e-fix [markdown]
# The last rank's shard must run to the end: `stop = len(data) if rank == world - 1 else (rank + 1) * per`.

# %% drill-e-fix-code
print("mean over the ranks:", mean, "| true mean:", 5.0)
assert (mean == 5.0) == (11 % world_size == 0), "with 11 samples on 2 ranks, sample 10 is in no shard"

# %% check [markdown]
# ## Check

# %% check-code
assert len(comm) == world_size
for c in comm:
    assert any(k.endswith("all_reduce") for k in c["events"]), c     # the profiler saw DDP's all-reduce
    assert c["us"] > 0
assert traces == [f"rank{r}" for r in range(world_size)], traces   # one trace per rank, one active window
assert not any("profiler_start" in r.stderr for r in profiled.ranks), [r.stderr for r in profiled.ranks]   # KINETO_LOG_LEVEL=6 quieted it
print("ok: per-rank logs, per-rank profiles with the all-reduce, and the drills behaved as the cheat sheet says")

# %% exercise [markdown]
# ## Exercise
# Rank 0 is slow: it `sleep`s 0.2 s before each of 3 steps (a DDP model's forward and backward, then a
# `barrier()`). Profile every rank: which shows **more** time in `all_reduce` and `barrier`, the slow rank
# or the others? Why?
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your profiled straggler here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull waits
# where each rank sets `waits` to its ms inside gloo:all_reduce and gloo:barrier (from prof.key_averages()).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull waits
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile, ProfilerActivity
dist.init_process_group("gloo"); rank = dist.get_rank()
model = DDP(torch.nn.Linear(64, 1))
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for step in range(3):
        if rank == 0:
            time.sleep(0.2)                 # the straggler
        model(torch.randn(8, 64)).sum().backward()
        torch.distributed.barrier()
waits = sum(e.cpu_time_total for e in prof.key_averages() if e.key in ("gloo:all_reduce", "gloo:barrier")) / 1e3
print(f"rank {rank}: {waits:.1f} ms waiting in all_reduce/barrier")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "waits" in globals(), "✗ nothing to check yet: your cell should end with --pull waits"
print(dict(enumerate(waits)))
assert len(waits) == world_size, f"✗ {len(waits)} values for {world_size} ranks"
if world_size > 1:     # rank 0 sleeps 3 × 200 ms: the others wait for it inside the collectives
    assert min(waits[1:]) > 200, f"✗ the fast ranks waited only {min(waits[1:]):.1f} ms in all_reduce/barrier, less than one of rank 0's 200 ms sleeps: does rank 0 alone sleep, before each step, and do you sum the gloo:all_reduce and gloo:barrier events?"
    assert waits[0] < 0.5 * min(waits[1:]), f"✗ the straggler (rank 0) waited {waits[0]:.1f} ms, the others {waits[1:]}: make rank 0 alone sleep before each step"
print("✓ the fast ranks wait for the straggler inside the collective; the straggler hardly waits")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull waits
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import profile, ProfilerActivity
dist.init_process_group("gloo"); rank = dist.get_rank()
model = DDP(torch.nn.Linear(64, 1))
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for step in range(3):
        time.sleep(0.2)                     # meant for rank 0, but every rank sleeps: no one is late
        model(torch.randn(8, 64)).sum().backward()
        torch.distributed.barrier()
waits = sum(e.cpu_time_total for e in prof.key_averages() if e.key in ("gloo:all_reduce", "gloo:barrier")) / 1e3
dist.destroy_process_group()
# expect: ✗ the fast ranks waited only
