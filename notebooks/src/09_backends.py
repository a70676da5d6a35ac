# %% title [markdown]
# # 09 · Backends: gloo, NCCL, MPI (通信后端)
#
# | backend | devices | when to use |
# |---|---|---|
# | **gloo** | CPU tensors (and CUDA for some ops, slowly) | CPU training, tests, a laptop; ships with every torch build |
# | **NCCL** | CUDA tensors only | GPU training — the fastest on NVIDIA GPUs (NVLink, InfiniBand); Linux + CUDA builds |
# | **MPI** | CPU (CUDA with a CUDA-aware MPI) | HPC clusters with an MPI installation; needs torch **built from source** with MPI |
#
# Rule of thumb: `"nccl"` for GPUs, one per rank; `"gloo"` for CPU. `nbddp.backend()` in a rank returns the
# backend its launch was made for: `%%ddp`'s default `--backend auto` means nccl where every rank of a machine
# has a GPU of its own, and gloo where there are none or fewer GPUs than ranks (NCCL refuses two ranks on
# one GPU; the launch line then says so); `%%ddp --backend` asks for one.

# %% parameters tags=["parameters"]
world_size = 2
reps = 5
trials = 25        # each size is timed `trials` times (reps calls back to back), the sizes in turn; the best counts
max_log2 = 20      # largest tensor: 2**20 floats = 4 MiB

# %% load-ext
# %load_ext nbddp

# %% what-this-torch-can [markdown]
# ## 1 · What this torch can do

# %% what-this-torch-can-code
import torch, torch.distributed as dist
available = {
    "gloo": dist.is_gloo_available(),
    "nccl": dist.is_nccl_available(),
    "mpi": dist.is_mpi_available(),
}
print("torch", torch.__version__, "| CUDA available:", torch.cuda.is_available(), "| GPUs:", torch.cuda.device_count())
for name, ok in available.items():
    print(f"{name:5} built in: {ok}")

# %% what-this-torch-can-ddp
# %%ddp -n $world_size --timeout 60 --pull in_use
import nbddp, torch.distributed as dist
dist.init_process_group(nbddp.backend())
in_use = dist.get_backend()
print(f"rank {dist.get_rank()}: nbddp.backend() = {nbddp.backend()}, in use: {in_use}")
dist.destroy_process_group()

# %% what-this-torch-can-code-2
chosen = "nccl" if torch.cuda.device_count() >= world_size else "gloo"   # --backend auto: a GPU per rank, or gloo
assert in_use == [chosen] * world_size, in_use

# %% what-this-torch-can-note [markdown]
# Asking for NCCL on a machine without it fails at once, with a hint (caught here on purpose):

# %% what-this-torch-can-code-3
import nbddp
if not available["nccl"]:
    try:
        nbddp.run("import torch.distributed as dist\ndist.init_process_group('nccl')\n", n=world_size, timeout=60)
        raise AssertionError("expected an error")
    except nbddp.DDPError as exc:
        nccl_error = exc.result.failed[0]
    print(nccl_error.cause, "\nhint:", nccl_error.hint)
    assert "NCCL" in nccl_error.cause and "gloo" in nccl_error.hint
else:
    print("NCCL is available here")

# %% nccl-on-a-gpu [markdown]
# ### On a GPU: NCCL takes CUDA tensors only
# This cell needs CUDA; without it, it says so and does nothing (its run on a GPU machine is
# `docs/lessons/gpu/09_backends.ipynb`, listed on the docs page *GPU runs*). One rank on one GPU, with
# `init_process_group("nccl", ...)`: an `all_reduce` of a tensor on the GPU runs through NCCL, and one of a
# CPU tensor is refused, since a group made with `"nccl"` alone has no backend for the CPU. Objects and CPU
# tensors then go through a gloo group beside it (`dist.new_group(backend="gloo")`); `init_process_group`
# also takes both at once, as `"cpu:gloo,cuda:nccl"`.
#
# What one GPU cannot show: NCCL between GPUs. With one rank, an all-reduce has no other GPU to talk to, so
# its time says nothing of NVLink or InfiniBand. A measurement like section 2's, for NCCL, needs a rank on
# each of several GPUs (NVIDIA's `nccl-tests` measure NCCL's collectives without torch).

# %% nccl-on-a-gpu-ddp
# %%ddp -n 1 --timeout 60 --pull nccl_run@0
import os, torch, torch.distributed as dist
nccl_run = None
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here (its run on a GPU: docs/lessons/gpu/09_backends.ipynb)")
else:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    t = torch.ones(4, device=device)
    dist.all_reduce(t)                                   # NCCL, on the GPU
    nccl_run = {"backend": dist.get_backend(), "CUDA tensor": f"all_reduce gave {t.tolist()} on {t.device}"}
    try:
        dist.all_reduce(torch.ones(4))                   # a CPU tensor, in a group with NCCL alone
        nccl_run["CPU tensor"] = "accepted"
    except RuntimeError as exc:
        nccl_run["CPU tensor"] = "refused: " + str(exc).strip().splitlines()[0]
    cpu_group = dist.new_group(backend="gloo")           # a gloo group beside it, for CPU tensors
    c = torch.ones(4)
    dist.all_reduce(c, group=cpu_group)
    nccl_run["CPU tensor, gloo group"] = f"all_reduce gave {c.tolist()} on {c.device}"
    for key, value in nccl_run.items():
        print(f"{key:22} {value}")
    dist.destroy_process_group()

# %% nccl-on-a-gpu-code
if nccl_run is None:
    print("no GPU here: the cell above was skipped")
else:
    assert nccl_run["backend"] == "nccl" and nccl_run["CUDA tensor"] == "all_reduce gave [1.0, 1.0, 1.0, 1.0] on cuda:0", nccl_run
    assert nccl_run["CPU tensor"] == "refused: No backend type associated with device type cpu", nccl_run
    assert nccl_run["CPU tensor, gloo group"] == "all_reduce gave [1.0, 1.0, 1.0, 1.0] on cpu", nccl_run
    print("NCCL took the CUDA tensor and refused the CPU one; a gloo group took that")

# %% measured-gloo-all_reduce-time [markdown]
# ## 2 · Measured: gloo `all_reduce` time vs tensor size
# Small tensors cost a fixed latency; large ones are limited by bandwidth. (This is why DDP packs gradients
# into *buckets*, 25 MiB by default, instead of one all-reduce per parameter.)
#
# Each rank runs one thread. Every size is warmed up first, then timed `trials` times, `reps` calls back to
# back each time, the sizes in turn (16 B, 64 B, ..., 4 MiB, then again), so every size meets the same
# moments of a busy machine; the best trial counts: the one least disturbed by other programs (on a shared
# machine a rank that waits for its peer may sleep, and be woken late).

# %% measured-gloo-all_reduce-time-ddp
# %%ddp -n $world_size --timeout 60 --pull rows@0 -- $reps $trials $max_log2
import sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
reps, trials, max_log2 = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tensors = [torch.ones(2 ** k) for k in range(2, max_log2 + 1, 2)]     # 16 B ... 4 MiB
best = [float("inf")] * len(tensors)
for t in tensors:
    for _ in range(3):
        dist.all_reduce(t)                     # warm up, untimed
for trial in range(trials):
    for i, t in enumerate(tensors):            # the sizes in turn: all meet the same load
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)                 # back to back, as in a training step
        best[i] = min(best[i], (time.perf_counter() - t0) / reps)
rows = [[t.numel() * 4, b] for t, b in zip(tensors, best)]
dist.destroy_process_group()

# %% measured-gloo-all_reduce-time-code
import matplotlib.pyplot as plt
sizes, secs = [r[0] for r in rows], [r[1] for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
a.loglog(sizes, [s * 1e3 for s in secs], "o-"); a.set_xlabel("tensor size (bytes)"); a.set_ylabel("all_reduce time (ms)")
a.yaxis.set_major_formatter("{x:g}")
a.yaxis.set_minor_formatter(lambda x, _: f"{x:g}" if f"{x:.0e}"[0] in "235" else "")   # 0.2, 0.3, 0.5, 2, ...
a.set_title(f"gloo all_reduce, {world_size} ranks, CPU")
b.semilogx(sizes, [n / s / 1e6 for n, s in zip(sizes, secs)], "o-", color="C1")
b.set_xlabel("tensor size (bytes)"); b.set_ylabel("algorithm bandwidth (MB/s)"); b.set_title("size / time")
fig.tight_layout(); plt.show()
for n, s in rows:
    print(f"{n:>10,} B  {s * 1e3:8.3f} ms  {n / s / 1e6:9.1f} MB/s")

# %% check [markdown]
# ## Check

# %% check-code
assert available["gloo"] and len(rows) == len(range(2, max_log2 + 1, 2))
small = [s for n, s in zip(sizes, secs) if n <= 4096]              # 16 B ... 4 KB
assert max(small) < 3 * min(small), f"small tensors should cost about the same (a fixed latency): {small}"
assert secs[-1] > 3 * secs[0], f"4 MiB should take clearly longer than 16 B: {secs[0]}, {secs[-1]}"
bw = [n / s for n, s in zip(sizes, secs)]
assert bw[-1] > 10 * bw[0], "bandwidth grows with size: small messages are latency-bound"
print(f"ok: latency {min(small) * 1e6:.0f}-{max(small) * 1e6:.0f} us from 16 B to 4 KB; "
      f"{secs[-1] * 1e3:.2f} ms and {bw[-1] / 1e6:.0f} MB/s at {sizes[-1] / 2**20:.0f} MiB")

# %% exercise [markdown]
# ## Exercise
# Compare `broadcast` and `all_reduce` for a 1 MiB tensor of float32s. Which is faster, and why? Time one call
# of each, in milliseconds, after a warm-up call; take the median of `reps` calls.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your timing here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull bcast@0,allred@0,nbytes@0 -- $reps
# `bcast` and `allred`: rank 0's median time of one broadcast / all_reduce, in ms; `nbytes`: the tensor's size
# in bytes (t.numel() * t.element_size()).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull bcast@0,allred@0,nbytes@0 -- $reps
import statistics, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
reps = int(sys.argv[1]); t = torch.ones(2 ** 18)      # 2**18 float32s of 4 bytes = 1 MiB
nbytes = t.numel() * t.element_size()
def timed(fn):
    fn(); out = []
    for _ in range(reps):
        dist.barrier(); t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return statistics.median(out)
bcast, allred = timed(lambda: dist.broadcast(t, 0)) * 1e3, timed(lambda: dist.all_reduce(t)) * 1e3
if dist.get_rank() == 0:
    print(f"broadcast {bcast:.3f} ms, all_reduce {allred:.3f} ms")
    # broadcast: rank 0's data goes one way, once. all_reduce: every rank sends and receives its share,
    # adds, and sends the sums back (in a ring, 2(N-1) steps that wait on each other): 2x the bytes in all
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert all(name in globals() for name in ("bcast", "allred", "nbytes")), "✗ nothing to check yet: your cell should end with --pull bcast@0,allred@0,nbytes@0"
assert nbytes == 2 ** 20, f"✗ the tensor has {nbytes:,} bytes, not 1 MiB ({2 ** 20:,}): 2**18 float32 elements of 4 bytes each"
ref = dict(rows)[2 ** 20] * 1e3                       # section 2's all_reduce of 1 MiB, in ms
assert ref / 5 < allred < ref * 20, f"✗ all_reduce took {allred} 'ms', section 2 measured {ref:.3f} ms for 1 MiB: time one call (divide by the repeats) in milliseconds (seconds × 1e3)"
assert bcast < allred, f"✗ broadcast ({bcast:.3f} ms) was not faster than all_reduce ({allred:.3f} ms): warm up first, then take the median of several calls, each after a barrier"
print(f"✓ broadcast {bcast:.3f} ms, all_reduce {allred:.3f} ms")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull bcast@0,allred@0,nbytes@0 -- $reps
import statistics, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
reps = int(sys.argv[1]); t = torch.ones(2 ** 20)      # "2**20 = 1 Mi": but of 4-byte floats, 4 MiB
nbytes = t.numel() * t.element_size()
def timed(fn):
    fn(); out = []
    for _ in range(reps):
        dist.barrier(); t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return statistics.median(out)
bcast, allred = timed(lambda: dist.broadcast(t, 0)) * 1e3, timed(lambda: dist.all_reduce(t)) * 1e3
dist.destroy_process_group()
# expect: ✗ the tensor has 4,194,304 bytes

# %% mistake-seconds tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull bcast@0,allred@0,nbytes@0 -- $reps
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
reps = int(sys.argv[1]); t = torch.ones(2 ** 18); nbytes = t.numel() * t.element_size()
dist.broadcast(t, 0); dist.all_reduce(t)             # warm up
t0 = time.perf_counter()
for _ in range(reps):
    dist.broadcast(t, 0)
bcast = time.perf_counter() - t0                     # seconds, and all reps together
t0 = time.perf_counter()
for _ in range(reps):
    dist.all_reduce(t)
allred = time.perf_counter() - t0
dist.destroy_process_group()
# expect: ✗ all_reduce took .* section 2 measured
