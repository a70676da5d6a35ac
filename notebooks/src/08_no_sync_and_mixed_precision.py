# %% title [markdown]
# # 08 · Gradient accumulation with `no_sync()`, and mixed precision (梯度累积与混合精度)
#
# **Accumulation** (梯度累积): a big batch does not fit, so run `k` micro-batches and step once. With DDP,
# every `backward()` all-reduces gradients — wasted for the first `k-1` micro-batches. Inside
# `with model.no_sync():` DDP only accumulates locally; the last `backward()` outside it syncs everything.
# The result must equal one step on the **whole global batch** — we check exactly that. Two details make it
# so: each micro-batch's loss is divided by `k` (the gradients of `k` backwards **add up**; `loss / k` makes
# the sum a mean), and the **forward** runs inside `no_sync()` too (DDP decides in `forward()` whether the
# coming backward synchronises; section 1 measures a forward outside with only `backward()` inside).
#
# **Mixed precision** (混合精度): on CPU, `torch.autocast("cpu", dtype=torch.bfloat16)` runs matmuls in
# bfloat16 while the weights stay float32. The classic recipe is fp16 + `GradScaler` (scales the loss so
# small fp16 gradients do not underflow); `torch.amp.GradScaler("cpu")` runs it here too (section 3), and
# section 4 runs it on a GPU where there is one.

# %% parameters tags=["parameters"]
world_size = 2
accum = 4

# %% load-ext
# %load_ext nbddp

# %% no_sync-gives-big-batch [markdown]
# ## 1 · `no_sync` gives the big-batch gradient, with one all-reduce instead of `accum`
# A DDP comm hook counts how often DDP all-reduces: it is called **once per gradient bucket** each time DDP
# synchronises (DDP packs gradients into buckets of `bucket_cap_mb`, 25 MiB by default; this model fits in
# one, lesson 12 shows more). A plain copy of the model computes the big-batch gradient. Four ways to
# accumulate: `no_sync` around forward and backward, no `no_sync` at all (with the loss divided by `accum`),
# `no_sync` around the backward only, and the articles' loop (no `no_sync`, the loss not divided).
#
# > **What the articles get wrong.** Their accumulation loop calls `loss.backward()` on every micro-batch
# > without `no_sync()` and without dividing the loss by `k`. The first costs `k` all-reduces per step
# > instead of one (below: `accum` hook calls, not 1); the second makes the gradient the **sum** of `k`
# > micro-batch gradients, `k` times the big batch's (below: `|grad| / |big batch grad|` = `accum`): with
# > SGD, as if the learning rate were `k` times larger.

# %% no_sync-gives-big-batch-ddp
# %%ddp -n $world_size --timeout 60 --pull results -- $accum
import contextlib, copy, sys
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum, micro = dist.get_rank(), dist.get_world_size(), int(sys.argv[1]), 8

g = torch.Generator().manual_seed(1)
X = torch.randn(world * accum * micro, 6, generator=g); Y = torch.randn(world * accum * micro, 1, generator=g)
mine = slice(rank * accum * micro, (rank + 1) * accum * micro)     # this rank's part of the global batch

def run(how):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    reference = copy.deepcopy(net)
    model = DDP(net)
    buckets = []
    def counting(state, bucket):
        buckets.append(bucket.index())
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting)
    Xr, Yr = X[mine], Y[mine]
    for i in range(accum):
        quiet = model.no_sync() if i < accum - 1 else contextlib.nullcontext()
        xb, yb = Xr[i * micro:(i + 1) * micro], Yr[i * micro:(i + 1) * micro]
        if how == "backward only in no_sync":
            loss = F.mse_loss(model(xb), yb) / accum      # forward outside: DDP already decided to sync
            with quiet:
                loss.backward()
        else:
            with quiet if how == "no_sync" else contextlib.nullcontext():
                loss = F.mse_loss(model(xb), yb) / (1 if how == "articles' loop" else accum)
                loss.backward()
    F.mse_loss(reference(X), Y).backward()        # one step on the whole global batch, no DDP
    got, big = (torch.cat([p.grad.flatten() for p in m.parameters()]) for m in (model.module, reference))
    return {"hook calls": len(buckets), "buckets": len(set(buckets)),
            "max grad diff": (got - big).abs().max().item(), "grad / big batch grad": (got.norm() / big.norm()).item()}

results = {how: run(how) for how in ("no_sync", "no no_sync", "backward only in no_sync", "articles' loop")}
for how, r in results.items():
    print(f"{how:25} {r}")
dist.destroy_process_group()

# %% no_sync-gives-big-batch-code
for rank, per_how in enumerate(results):                  # --pull results: one dict per rank
    for how, r in per_how.items():
        print(f"rank {rank} {how:25}: {r['hook calls']} all-reduce call(s) over {r['buckets']} bucket(s), "
              f"|grad| / |big batch grad| = {r['grad / big batch grad']:.4f}, max |grad - big batch grad| = {r['max grad diff']:.1e}")

# %% bfloat16-autocast-on-cpu [markdown]
# ## 2 · bfloat16 autocast on CPU
# The forward runs in bfloat16 under `autocast`; the loss is computed in float32 and gradients land on the
# float32 weights.

# %% bfloat16-autocast-on-cpu-ddp
# %%ddp -n $world_size --timeout 60 --pull amp
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(dist.get_rank())
X = torch.randn(256, 16, generator=g); y = X[:, :1] * 2
losses = []
for step in range(30):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(X)
    loss = F.mse_loss(out.float(), y)
    loss.backward(); opt.step()
    losses.append(loss.item())
p = next(model.parameters())
amp = {"out": str(out.dtype), "weights": str(p.dtype), "grads": str(p.grad.dtype), "first": losses[0], "last": losses[-1]}
print(amp)
dist.destroy_process_group()

# %% fp16-gradscaler-on-cpu [markdown]
# ## 3 · fp16 + `GradScaler`, on CPU
# `GradScaler` multiplies the loss by a large scale (65536 at first) before `backward()`, divides the
# gradients by it before the step, and when a gradient is `inf`/`nan` **skips the step and halves the
# scale** (here the first steps overflow fp16 by themselves: the scale finds its level). One step below is
# given an infinite loss on purpose: the weights do not move and the scale halves.
#
# > **Dated in the articles.** `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()` are deprecated
# > (torch 2.4 and later warn with a `FutureWarning`; in torch 2.13 `torch/cuda/amp/*.py` are thin wrappers):
# > write `torch.amp.autocast("cuda", ...)` (or `torch.autocast`) and `torch.amp.GradScaler("cuda")`, the
# > spelling that also works for `"cpu"`. The cell below calls the old ones to show their warnings.

# %% fp16-gradscaler-on-cpu-ddp
# %%ddp -n $world_size --timeout 60 --pull scaled@0
import warnings, torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu")
X = torch.randn(256, 16); y = X[:, :1] * 2
scaled = {"scale at start": scaler.get_scale()}
for step in range(20):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(X).float(), y)
    if step == 10:
        loss = loss * float("inf")               # an overflow, on purpose
        before = model.module.weight.detach().clone()
        scaled["scale before the inf step"] = scaler.get_scale()
    scaler.scale(loss).backward()                # scaled loss: fp16 grads do not underflow
    scaler.step(opt)                             # unscales; skips the step on inf/nan
    scaler.update()                              # and then halves the scale
    if step == 10:
        scaled["weights moved on the inf step"] = not torch.equal(before, model.module.weight)
        scaled["scale after the inf step"] = scaler.get_scale()
scaled["last loss"] = loss.item()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.amp.GradScaler()
    torch.cuda.amp.autocast()
scaled["deprecated"] = [str(w.message).split(" instead")[0] for w in caught if "deprecated" in str(w.message)]
if dist.get_rank() == 0:
    print(scaled)
dist.destroy_process_group()

# %% cuda-fp16-gradscaler-runs [markdown]
# ## 4 · CUDA: fp16 + `GradScaler` for real
# The same recipe on a GPU, spelled as torch 2.13 wants it: `torch.autocast("cuda", dtype=torch.float16)` and
# `torch.amp.GradScaler("cuda")`. These cells need CUDA; without it they say so and do nothing (their run
# on a GPU machine is `docs/lessons/gpu/08_no_sync_and_mixed_precision.ipynb`, listed on the docs page
# *GPU runs*). First one rank on one GPU, section 3's run on CUDA: the forward in float16, float32 weights
# and gradients, the scale starting at 65536, and the step given an infinite loss skipped, the scale halved.

# %% cuda-fp16-gradscaler-one-gpu-ddp
# %%ddp -n 1 --timeout 60 --pull cuda_scaled@0
import os, torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
cuda_scaled = None
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here (its run on a GPU: docs/lessons/gpu/08_no_sync_and_mixed_precision.ipynb)")
else:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    X = torch.randn(256, 16, device="cuda"); y = X[:, :1] * 2
    cuda_scaled = {"scale at start": scaler.get_scale(), "losses": []}
    for step in range(30):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(X)
            loss = F.mse_loss(out.float(), y)
        cuda_scaled["losses"].append(loss.item())
        if step == 10:
            loss = loss * float("inf")           # an overflow, on purpose
            before = model.module.weight.detach().clone()
            cuda_scaled["scale before the inf step"] = scaler.get_scale()
        scaler.scale(loss).backward()            # scaled loss: fp16 grads do not underflow
        scaler.step(opt)                         # unscales; skips the step on inf/nan
        scaler.update()                          # and then halves the scale
        if step == 10:
            cuda_scaled["weights moved on the inf step"] = not torch.equal(before, model.module.weight)
            cuda_scaled["scale after the inf step"] = scaler.get_scale()
    p = model.module.weight
    cuda_scaled.update(out=str(out.dtype), weights=str(p.dtype), grads=str(p.grad.dtype), device=str(p.device))
    print({k: v for k, v in cuda_scaled.items() if k != "losses"},
          f"loss {cuda_scaled['losses'][0]:.3f} -> {cuda_scaled['losses'][-1]:.4f}")
    dist.destroy_process_group()

# %% cuda-fp16-gradscaler-one-gpu-code
if cuda_scaled is None:
    print("no GPU here: the cell above was skipped")
else:
    c = cuda_scaled
    assert (c["out"], c["weights"], c["grads"], c["device"]) == ("torch.float16", "torch.float32", "torch.float32", "cuda:0"), c
    assert c["scale at start"] == 65536.0 and not c["weights moved on the inf step"], c
    assert c["scale after the inf step"] == c["scale before the inf step"] / 2, c
    assert c["losses"][-1] < c["losses"][0] / 2, c["losses"]      # fp16 with a GradScaler trains
    print(f"fp16 on CUDA: loss {c['losses'][0]:.3f} -> {c['losses'][-1]:.4f}, the inf step skipped and the scale halved")

# %% cuda-fp16-gradscaler-runs-note [markdown]
# Then one rank per GPU, the way DDP is run on GPUs: this cell needs a CUDA GPU for each of its `world_size`
# ranks (`torch.cuda.device_count() >= LOCAL_WORLD_SIZE`), and says so where there are fewer, as on a
# machine with one GPU: two ranks cannot share one GPU under NCCL.

# %% cuda-fp16-gradscaler-runs-ddp
# %%ddp -n $world_size --timeout 60
import os, torch
local_ranks = int(os.environ["LOCAL_WORLD_SIZE"])
if not (torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks):
    print(f"skipped: needs one CUDA GPU per rank ({local_ranks} ranks, {torch.cuda.device_count()} GPUs here)")
else:
    import torch.distributed as dist, torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    X = torch.randn(256, 16, device="cuda"); y = X[:, :1] * 2
    for step in range(30):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(model(X).float(), y)
        scaler.scale(loss).backward()     # scaled loss: fp16 grads do not underflow
        scaler.step(opt)                  # unscales; skips the step on inf/nan
        scaler.update()
    print(f"fp16 loss {loss.item():.3f}, scale {scaler.get_scale():.0f}")
    dist.destroy_process_group()

# %% check [markdown]
# ## Check

# %% check-code
assert _ddp.ok and all(("skipped" in r.stdout) or ("fp16 loss" in r.stdout) for r in _ddp.ranks)
for a in amp:
    assert (a["out"], a["weights"], a["grads"]) == ("torch.bfloat16", "torch.float32", "torch.float32"), a
    assert a["last"] < a["first"] / 2, a                                # bf16 autocast still trains
for per_how in results:
    quiet, chatty, half = per_how["no_sync"], per_how["no no_sync"], per_how["backward only in no_sync"]
    assert all(per_how[h]["max grad diff"] < 1e-5 for h in ("no_sync", "no no_sync", "backward only in no_sync")), per_how
    assert quiet["buckets"] == 1 and quiet["hook calls"] == 1            # one bucket, synced once
    assert chatty["hook calls"] == accum * quiet["hook calls"], per_how  # no_sync saved accum-1 all-reduces
    assert half["hook calls"] == chatty["hook calls"], per_how           # forward outside no_sync: no saving
    articles = per_how["articles' loop"]
    assert articles["hook calls"] == accum and abs(articles["grad / big batch grad"] - accum) < 1e-4, articles
assert scaled["scale at start"] == 65536.0 > scaled["scale before the inf step"], scaled   # early overflows halved it
assert scaled["scale after the inf step"] == scaled["scale before the inf step"] / 2, scaled      # halved
assert not scaled["weights moved on the inf step"], scaled
assert [d.split("(")[0] for d in scaled["deprecated"]] == ["`torch.cuda.amp.GradScaler", "`torch.cuda.amp.autocast"], scaled
print("ok: no_sync accumulation == big batch, with", results[0]["no_sync"]["hook calls"], "instead of",
      results[0]["no no_sync"]["hook calls"], "all-reduce calls; GradScaler skipped the overflowing step")

# %% exercise [markdown]
# ## Exercise
# Accumulate over `accum` micro-batches with `no_sync()` **and** bfloat16 autocast, and show on every rank that
# 1. DDP all-reduced **once** for the step (count with a comm hook, as in section 1): `calls`;
# 2. the gradient before `opt.step()` is the **whole global batch's** (the check computes it itself, so use
#    these): `torch.manual_seed(0)` then `model = DDP(torch.nn.Linear(6, 1))`;
#    `X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))`; rank `r`'s micro-batch
#    `i` is `X[r * accum + i]`, and its loss `model(xb).float().pow(2).mean()`. Report
#    `grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()`;
# 3. after `opt.step()` the weights are identical across ranks (`all_gather` a checksum): `identical`;
# 4. the forward ran in bfloat16: `out_dtype = str(out.dtype)`, `out` being the model's output under autocast.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your accumulation here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import contextlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
for i in range(accum):
    ctx = model.no_sync() if i < accum - 1 else contextlib.nullcontext()
    with ctx:                                     # forward and backward inside no_sync
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X[rank * accum + i])
        (out.float().pow(2).mean() / accum).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
print(f"{calls} all-reduce call(s); replicas identical: {identical}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert all(n in globals() for n in ("calls", "grad", "identical", "out_dtype")), "✗ nothing to check yet: your cell should end with --pull calls,grad,identical,out_dtype"
import torch
torch.manual_seed(0)
big = torch.nn.Linear(6, 1)                       # the same weights as every rank's model
X_all = torch.randn(world_size * accum, 8, 6, generator=torch.Generator().manual_seed(0))
big(X_all.reshape(-1, 6)).pow(2).mean().backward()   # the whole global batch, float32, no DDP
want = torch.cat([p.grad.flatten() for p in big.parameters()])
assert max(calls) > 0, f"✗ DDP never all-reduced (per rank: {calls}): the last micro-batch must run outside no_sync(), so its backward all-reduces what the others accumulated"
assert all(c == 1 for c in calls), f"✗ DDP all-reduced {max(calls)} times for one step (per rank: {calls}): run the first accum-1 micro-batches, forward and backward, inside model.no_sync()"
assert all(identical), f"✗ ranks {[r for r, i in enumerate(identical) if not i]} see different weights after one all-reduce: it must come with the last micro-batch (the first accum-1 inside no_sync(), the last outside), after the others accumulated"
assert all(str(d) == "torch.bfloat16" for d in out_dtype), f"✗ the forward ran in {out_dtype[0]}, not bfloat16: run model(xb) under torch.autocast('cpu', dtype=torch.bfloat16)"
ratio = torch.tensor(grad[0]).norm().item() / want.norm().item()
whole = all(torch.allclose(torch.tensor(g), want, rtol=0.03, atol=1e-3) for g in grad)   # bfloat16: within 3%
assert whole or abs(ratio - accum) > 0.2, f"✗ the gradient is {ratio:.2f}× the whole batch's: divide each micro-batch's loss by accum"
assert whole, f"✗ the gradient {[round(v, 4) for v in grad[0]]} is not the whole batch's {[round(v, 4) for v in want.tolist()]}: the model, data and loss as the exercise gives them?"
print(f"✓ one all-reduce for {accum} micro-batches, a bfloat16 forward, the whole batch's gradient (within 3%), identical replicas")

# %% mistake-no-no_sync tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
for i in range(accum):                            # every backward syncs: no no_sync()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(X[rank * accum + i])
    (out.float().pow(2).mean() / accum).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
dist.destroy_process_group()
# expect: ✗ DDP all-reduced 4 times

# %% mistake-not-divided tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import contextlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
for i in range(accum):
    with model.no_sync() if i < accum - 1 else contextlib.nullcontext():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X[rank * accum + i])
        out.float().pow(2).mean().backward()      # the loss not divided by accum
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
dist.destroy_process_group()
# expect: ✗ the gradient is 4\.\d\d× the whole batch's

# %% mistake-all-in-no_sync tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import contextlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
with model.no_sync():                             # every micro-batch inside: nothing ever syncs
    for i in range(accum):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X[rank * accum + i])
        (out.float().pow(2).mean() / accum).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
dist.destroy_process_group()
# expect: ✗ DDP never all-reduced

# %% mistake-sync-first tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import contextlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
for i in range(accum):
    with model.no_sync() if i > 0 else contextlib.nullcontext():   # syncs the first micro-batch, not the last
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(X[rank * accum + i])
        (out.float().pow(2).mean() / accum).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
dist.destroy_process_group()
# expect: ✗ ranks \[0, 1\] see different weights

# %% mistake-float32 tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull calls,grad,identical,out_dtype -- $accum
import contextlib, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
dist.init_process_group("gloo")
rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = 0
def counting(state, bucket):
    global calls
    calls += 1
    return allreduce_hook(state, bucket)
model.register_comm_hook(None, counting)
X = torch.randn(world * accum, 8, 6, generator=torch.Generator().manual_seed(0))
for i in range(accum):
    with model.no_sync() if i < accum - 1 else contextlib.nullcontext():
        out = model(X[rank * accum + i])          # no autocast: float32
        (out.float().pow(2).mean() / accum).backward()
grad = torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()
out_dtype = str(out.dtype)
opt.step()
checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
identical = all(torch.equal(e, every[0]) for e in every)
dist.destroy_process_group()
# expect: ✗ the forward ran in torch\.float32
