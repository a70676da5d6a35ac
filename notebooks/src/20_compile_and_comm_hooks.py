# %% title [markdown]
# # 20 · Faster DDP: communication hooks and `torch.compile`
#
# Two ways to make a DDP step cheaper without changing the model:
#
# - **send fewer bytes**: a *communication hook* replaces what DDP does with each gradient bucket (lesson 12:
#   an all-reduce of 32-bit floats). `fp16_compress_hook` sends 16-bit floats; **PowerSGD** sends a rank-*r*
#   approximation of each gradient matrix. Both change the gradients a little; §1 measures how much, against
#   the bound each one has.
# - **compute faster**: `torch.compile` turns the model's forward (and, through AOTAutograd, its backward)
#   into graphs. Under DDP one graph would finish the whole backward before any bucket could be sent, so
#   Dynamo's **DDPOptimizer** cuts the graph at DDP's bucket boundaries (§2), and the compiled job must train
#   exactly as the eager one.

# %% parameters tags=["parameters"]
world_size = 2
rank_r = 2            # PowerSGD's matrix approximation rank

# %% load-ext
# %load_ext nbddp

# %% hooks [markdown]
# ## 1 · Communication hooks on gloo: the gradients and the bytes
# Each rank builds the same model three times, with no hook, with `fp16_compress_hook`, and with
# `powerSGD_hook` (rank `rank_r`, no error feedback, no warm start: the plain approximation), takes two steps
# of gradients on its own data, and keeps the second step's averaged gradients (PowerSGD starts compressing
# at iteration `start_powerSGD_iter=1`; iteration 0 is a plain all-reduce). A small wrapper around
# `dist.all_reduce`, which both hooks call, counts the bytes each rank hands to it.

# %% hooks-ddp
# %%ddp -n $world_size --timeout 90 --push rank_r --pull grads@0,sent@0,local_norms
import copy, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as powersgd
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
g = torch.Generator().manual_seed(rank)                  # each rank its own data
x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)

sent, counting = [], [None]
real_all_reduce = dist.all_reduce
def all_reduce(tensor, *args, **kwargs):                 # the hooks call dist.all_reduce: count what they send
    if counting[0]:
        sent.append((counting[0], tensor.numel() * tensor.element_size()))
    return real_all_reduce(tensor, *args, **kwargs)
dist.all_reduce = all_reduce

def averaged_grads(name, hook=None, state=None):
    model = DDP(copy.deepcopy(base))
    if hook is not None:
        model.register_comm_hook(state, hook)
    for step in range(2):
        counting[0] = name if step == 1 else None
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
    counting[0] = None
    return {n: p.grad.clone() for n, p in model.module.named_parameters()}

grads = {"fp32": averaged_grads("fp32"),
         "fp16": averaged_grads("fp16", default_hooks.fp16_compress_hook),
         "powersgd": averaged_grads("powersgd", powersgd.powerSGD_hook, powersgd.PowerSGDState(
             process_group=None, matrix_approximation_rank=rank_r, start_powerSGD_iter=1,
             use_error_feedback=False, warm_start=False))}
local = copy.deepcopy(base)                              # this rank's own gradient, for the fp16 bound
torch.nn.functional.cross_entropy(local(x), y).backward()
local_norms = torch.cat([p.grad.flatten() for p in local.parameters()]).norm().item()
dist.all_reduce = real_all_reduce
sent = {name: sum(b for n, b in sent if n == name) for name in ("fp32", "fp16", "powersgd")}
print(f"rank {rank}: bytes handed to dist.all_reduce in one step: {sent}")
dist.destroy_process_group()

# %% hooks-measure [markdown]
# **Bytes.** Without a hook DDP's C++ reducer all-reduces the buckets itself (nothing passes through the Python
# `dist.all_reduce`, so the wrapper counts 0): 4 bytes per gradient element. fp16 sends 2. PowerSGD replaces
# an *n×m* gradient matrix *M* by two thin ones, *P = MQ* (*n×r*) and *Q = MᵀP* (*m×r*), all-reduced one after
# the other, so it sends *(n+m)·r* numbers instead of *n·m*; 1-D tensors (the biases) go uncompressed.
#
# **Errors.** fp16 rounds twice, when each rank casts its gradient (divided by the world size) and when the
# sum is formed, each time by at most 2⁻¹¹ of the value (10-bit mantissa), so the error's norm stays within
# 2⁻¹¹ · (mean of the ranks' gradient norms + the averaged gradient's norm). PowerSGD returns *PPᵀM*, the
# projection of the averaged gradient onto the *r* directions of *P* (orthonormalized), so its error lies
# between the best possible rank-*r* error (Eckart–Young: the singular values of *M* past the *r*-th) and
# ‖M‖ itself.

# %% hooks-measure-code
import torch
flat = lambda d: torch.cat([t.flatten() for t in d.values()])
ref = grads["fp32"]
numel = sum(t.numel() for t in ref.values())
matrices = {n: t for n, t in ref.items() if t.dim() == 2}
expected = {"fp32": 0, "fp16": 2 * numel,
            "powersgd": 4 * (sum((t.shape[0] + t.shape[1]) * rank_r for t in matrices.values())
                             + sum(t.numel() for t in ref.values() if t.dim() < 2))}
print(f"bytes per step: vanilla {4 * numel}, fp16 {sent['fp16']}, PowerSGD rank {rank_r} {sent['powersgd']} "
      f"({sent['powersgd'] / (4 * numel):.1%} of vanilla)")
assert sent == expected, (sent, expected)

fp16_error = (flat(grads["fp16"]) - flat(ref)).norm().item()
fp16_bound = 2 ** -11 * (sum(local_norms) / world_size + flat(ref).norm().item())
print(f"fp16: error {fp16_error:.2e} <= bound {fp16_bound:.2e}  (relative {fp16_error / flat(ref).norm():.1e})")
assert fp16_error <= fp16_bound, (fp16_error, fp16_bound)

for name, M in matrices.items():
    error = (grads["powersgd"][name] - M).norm().item()
    best = torch.linalg.svdvals(M)[rank_r:].norm().item()
    print(f"PowerSGD {name:8} {tuple(M.shape)}: error {error:.4f}, best rank-{rank_r} {best:.4f}, "
          f"‖M‖ {M.norm():.4f} (relative {error / M.norm():.2f})")
    assert best - 1e-5 <= error <= M.norm().item() + 1e-5, (name, error, best)
assert fp16_error / flat(ref).norm() < 1e-3 and sent["powersgd"] < 0.1 * 4 * numel, (fp16_error, sent)
assert all((grads["powersgd"][n] - M).norm() > 0.5 * M.norm() for n, M in matrices.items())   # most of M lost
for name, t in ref.items():
    if t.dim() < 2:
        assert torch.allclose(grads["powersgd"][name], t, atol=1e-6), name   # biases: sent uncompressed

# %% hooks-note [markdown]
# fp16 halves the bytes for an error within its bound, a few parts in 10,000 of the gradient here. PowerSGD
# sends under a tenth of them, for an error per step of most of each matrix (the relative errors above), which
# is why it is used with **error feedback** (on by default: what a step's approximation left out is added to
# the next step's gradient, so nothing is lost for good) and a warm start (`Q` kept between steps), both
# switched off above to show the plain approximation. Both hooks run on gloo as on NCCL.

# %% compile [markdown]
# ## 2 · `torch.compile` and DDP: one graph per bucket
# A model of five 1-MiB layers, `bucket_cap_mb=1`: DDP makes one bucket per layer or two. The model is
# compiled *inside* DDP, `DDP(torch.compile(model))`, with a **counting backend**: a function that Dynamo
# calls once per graph it made, which just runs the graph. With `torch._dynamo.config.optimize_ddp = True`
# (the default) Dynamo's DDPOptimizer splits the forward where DDP's buckets end
# (`torch/_dynamo/backends/distributed.py`), so each bucket's gradients are ready, and sent, while the rest
# of the backward runs; with `False` the model is one graph. Then the same model with the backend
# `aot_eager`, three SGD steps, against three steps of eager DDP.

# %% compile-ddp
# %%ddp -n $world_size --timeout 120 --pull split@0,whole@0,wrapped@0,buckets@0,gap,compiled_s@0
import copy, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
layers = [torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(4)]
base = torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))
g = torch.Generator().manual_seed(rank)
x, y = torch.randn(16, 512, generator=g), torch.randint(0, 10, (16,), generator=g)

def graphs_made(optimize_ddp, wrap_outside=False):
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = optimize_ddp
    made = []
    def counting(gm, example_inputs):                  # a backend: note the graph, run it as it is
        made.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        return gm.forward
    model = copy.deepcopy(base)
    ddp = (torch.compile(DDP(model, bucket_cap_mb=1), backend=counting) if wrap_outside
           else DDP(torch.compile(model, backend=counting), bucket_cap_mb=1))
    ddp(x).sum().backward()
    return made

split, whole, wrapped = graphs_made(True), graphs_made(False), graphs_made(True, wrap_outside=True)
torch._dynamo.reset(); torch._dynamo.config.optimize_ddp = True

def train(compiled):
    model = copy.deepcopy(base)
    ddp = DDP(torch.compile(model, backend="aot_eager") if compiled else model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad(); torch.nn.functional.cross_entropy(ddp(x), y).backward(); opt.step()
    return ddp, [p.detach().clone() for p in model.parameters()]

eager_ddp, eager = train(False)
start = time.monotonic()
_, compiled = train(True)
compiled_s = time.monotonic() - start
seen = []
def note_bucket(state, bucket):                         # a hook that notes each bucket, then all-reduces it
    seen.append(bucket.index())
    return default_hooks.allreduce_hook(None, bucket)
probe = DDP(copy.deepcopy(base), bucket_cap_mb=1)
probe.register_comm_hook(None, note_bucket)
for step in range(2):                                    # DDP rebuilds its buckets after the first step
    seen.clear(); probe(x).sum().backward()
buckets = len(set(seen))
gap = max((a - b).abs().max().item() for a, b in zip(eager, compiled))
print(f"rank {rank}: graphs with optimize_ddp=True {split}, False {whole}, torch.compile(DDP(...)) {wrapped}; "
      f"DDP buckets {buckets}; compiled vs eager after 3 steps: largest gap {gap:.1e} ({compiled_s:.1f} s)")
dist.destroy_process_group()

# %% compile-code
print(f"DDPOptimizer: {len(split)} graphs for {buckets} buckets (ops per graph {split}); "
      f"without it: {len(whole)} graph ({whole[0]} ops)")
assert len(split) == buckets > 1 and whole == [sum(split)], (split, whole, buckets)
assert wrapped == [], wrapped
assert max(gap) < 1e-5, gap
print(f"compiled DDP trained as eager DDP: largest parameter gap over the ranks {max(gap):.1e}")

# %% compile-note [markdown]
# One graph per bucket, the same operations in all. Two things seen on this machine with torch 2.13:
#
# - **Compile the model, then wrap it**: on its first call, `torch.compile(DDP(model))` handed the backend
#   **no graph at all** above (Dynamo breaks the graph in DDP's own `forward`, at its logger call and its
#   `_inside_ddp_forward` context; the model ran eagerly), while `DDP(torch.compile(model))` compiled it,
#   split by bucket.
# - **`bucket_cap_mb` below 1** is refused by DDPOptimizer: it asserts that DDP's first bucket (1 MiB,
#   `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`) is no larger than the others ("First bucket should be
#   smaller/equal to other buckets to get comms warmed up ASAP"), hence the 1-MiB layers here.
#
# The backend above is `aot_eager`: Dynamo's graphs and AOTAutograd's forward/backward split, run by eager
# kernels. The default backend, `inductor`, generates C++ for the CPU and compiles it with `gcc` (present
# here); with an empty compile cache, three steps of this model under inductor took close to a minute on
# this busy 2-core machine, more than this lesson's whole budget, and would test nothing more about DDP. **FSDP2** with `torch.compile` (compile each `fully_shard`ed block, so the
# all-gathers and reduce-scatters sit between graphs) is not run here for the same reason.

# %% check [markdown]
# ## Check

# %% check-code
assert _ddp.ok and sent == expected and fp16_error <= fp16_bound, (sent, expected, fp16_error, fp16_bound)
assert len(split) == buckets and whole == [sum(split)] and max(gap) < 1e-5, (split, whole, buckets, gap)
print(f"ok: fp16 sends half the bytes, PowerSGD {sent['powersgd'] / (4 * numel):.1%}, each within its error bound; "
      f"compiled DDP: {len(split)} graphs for {buckets} buckets, trained as eager DDP")

# %% exercise [markdown]
# ## Exercise
# Write `powersgd_bytes(model, r)`: the bytes one rank hands to `dist.all_reduce` in one step of
# `powerSGD_hook` at rank `r` (no error feedback; float32 gradients), for any model whose matrices are all
# compressed. The check compares it with what the wrapper counted in §1 for `rank_r`, and with rank 4 by the
# formula for the lesson's model.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your function here:
#   def powersgd_bytes(model, r): ...

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-code tags=["solution"]
def powersgd_bytes(model, r):
    numbers = 0
    for p in model.parameters():
        if p.dim() >= 2:
            n, m = p.shape[0], p[0].numel()          # a tensor is compressed as an n x (the rest) matrix
            numbers += (n + m) * r                   # P (n x r) and Q (m x r)
        else:
            numbers += p.numel()                     # 1-D: all-reduced as it is
    return 4 * numbers

# %% check-answer tags=["check"]
assert "powersgd_bytes" in globals(), "✗ nothing to check yet: define powersgd_bytes(model, r)"
lesson_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
said = powersgd_bytes(lesson_model, rank_r)
biases = 4 * (128 + 10)
assert said != sent["powersgd"] - biases, f"✗ powersgd_bytes says {said}: {biases} bytes short, the biases (1-D tensors) are all-reduced too, uncompressed"
assert said != 4 * sum(p.numel() for p in lesson_model.parameters()), f"✗ powersgd_bytes says {said}: that is the uncompressed gradient; PowerSGD sends P and Q"
assert said == sent["powersgd"], f"✗ powersgd_bytes says {said}, the wrapper counted {sent['powersgd']} bytes for rank {rank_r}: (n + m) * r numbers per n x m matrix, 4 bytes each"
assert powersgd_bytes(lesson_model, 4) == 4 * ((128 + 64) * 4 + (10 + 128) * 4 + 138), f"✗ at rank 4 powersgd_bytes says {powersgd_bytes(lesson_model, 4)}: does it use r?"
print(f"✓ PowerSGD at rank {rank_r} sends {said} bytes a step, {said / (4 * numel):.1%} of fp32's")

# %% mistake tags=["mistake"]
def powersgd_bytes(model, r):
    return 4 * sum((p.shape[0] + p[0].numel()) * r for p in model.parameters() if p.dim() >= 2)   # matrices only
# expect: ✗ powersgd_bytes says \d+: 552 bytes short, the biases
