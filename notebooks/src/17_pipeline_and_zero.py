# %% title [markdown]
# # 17 · Pipeline parallelism and ZeRO
#
# Two more ways to fit a model that one device cannot hold, both run here on CPU with gloo (torch 2.13):
# - **Pipeline parallelism** (`torch.distributed.pipelining`) cuts the model into consecutive **stages**, one
#   per rank: rank 0 runs the first layers, sends the activations to rank 1, which runs the next ones, and
#   the gradients travel back the same way. One batch would keep only one rank busy at a time, so the batch
#   is cut into **microbatches** that follow each other through the stages. The **schedule** decides the
#   order of forwards and backwards on each rank, and with it the idle time (the *bubble*) and how many
#   microbatches' activations a stage holds at once.
# - **ZeRO** (Zero Redundancy Optimizer) keeps data parallelism but stops every rank keeping the same
#   optimizer state. Stage 1 (`ZeroRedundancyOptimizer`) shards only the optimizer state; stage 3 is FSDP
#   (lesson 14), which shards parameters and gradients as well.
#
# Every claim below is checked against one device doing the same work, on real data:
# `nbddp.datasets.digits()` (8×8 handwritten digits, 10 classes).

# %% parameters tags=["parameters"]
world_size = 2      # pipeline stages (section 1), data-parallel ranks (section 2)
microbatches = 4
steps = 3

# %% load-ext
# %load_ext nbddp

# %% pipeline [markdown]
# ## 1 · A pipeline of two stages: GPipe and 1F1B
# A 4-layer MLP (64→256→256→256→10) is cut after its second layer: `model[:4]` is stage 0 on rank 0, `model[4:]`
# stage 1 on rank 1 (this split is written for 2 stages). Each rank wraps its piece in a `PipelineStage`, and a
# schedule drives it: rank 0 calls `step(X)` with the batch of 64 digits, the last rank `step(target=y,
# losses=...)`, and the schedule splits both into `microbatches` pieces along dim 0. It computes the loss
# per microbatch on the last stage and, by default (`scale_grads=True`), divides the gradients by the
# number of microbatches, so they are those of the mean loss over the batch: one device's.
#
# Two schedules run the same step:
# - **GPipe**: every microbatch's forward, then every backward (`ScheduleGPipe`);
# - **1F1B** (one forward, one backward): after a warm-up of (stages − rank) forwards, each rank alternates a
#   backward and a forward (`Schedule1F1B`), so a microbatch's activations are freed sooner.
#
# Each rank records every forward and backward its stage runs (the stage's own `forward_one_chunk` and
# `backward_one_chunk`, wrapped to append `(kind, microbatch, start, end)`), and compares its gradients with
# one device's, computed on the whole model in the same rank.

# %% pipeline-ddp
# %%ddp -n $world_size --timeout 90 --pull recorded,pipe_loss@1,ref_loss@1,grad_err -- --microbatches $microbatches
import argparse, copy, time, torch, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from nbddp.datasets import digits
parser = argparse.ArgumentParser(); parser.add_argument("--microbatches", type=int); args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, stages = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
X, y = digits("train"); X, y = X[:64], y[:64]
reference = copy.deepcopy(model)                         # one device: the whole model, the whole batch
loss = torch.nn.functional.cross_entropy(reference(X), y); loss.backward(); ref_loss = loss.item()
reference_grads = dict(reference.named_parameters())

def record(stage, log):
    """Wrap the stage's forward and backward of one microbatch so that each call is logged."""
    def timed(kind, call):
        def run(mb, *rest, **kw):
            start = time.time(); out = call(mb, *rest, **kw); log.append((kind, mb, start, time.time()))
            return out
        return run
    stage.forward_one_chunk = timed("F", stage.forward_one_chunk)
    stage.backward_one_chunk = timed("B", stage.backward_one_chunk)

recorded, pipe_loss, grad_err = {}, {}, {}
for schedule in (ScheduleGPipe, Schedule1F1B):
    piece = copy.deepcopy((model[:4], model[4:])[rank])  # parameter names stay the model's: 0.weight, 4.weight, ...
    stage = PipelineStage(piece, rank, stages, torch.device("cpu"))
    log = []; record(stage, log)
    pipe = schedule(stage, n_microbatches=args.microbatches, loss_fn=torch.nn.functional.cross_entropy)
    losses = []
    dist.barrier()
    if rank == 0:
        pipe.step(X)
    else:
        pipe.step(target=y, losses=losses)
        pipe_loss[schedule.__name__] = torch.stack(losses).mean().item()
    recorded[schedule.__name__] = log
    grad_err[schedule.__name__] = max((p.grad - reference_grads[n].grad).abs().max().item() for n, p in piece.named_parameters())
    print(f"rank {rank} {schedule.__name__:12}: {' '.join(f'{k}{mb}' for k, mb, *_ in log)}; gradients vs one device "
          f"{grad_err[schedule.__name__]:.1e}" + (f"; loss {pipe_loss[schedule.__name__]:.6f} (one device {ref_loss:.6f})" if rank else ""))
dist.destroy_process_group()

# %% schedule [markdown]
# ### The schedule, drawn from the recorded order
# How long a step takes on two processes that share two busy cores says more about the machine than about the
# schedule: a microbatch here computes in well under a millisecond, less than a message between two processes
# and the wake-up of the rank it was sent to take (the clock's view follows). So the drawing replays the **order** each rank recorded, on an ideal machine: a forward
# takes 1 unit, a backward 2 (it computes two products per layer), and every operation starts as soon as its
# rank is free and its input is there (a forward needs the previous stage's forward of that microbatch, a
# backward the next stage's backward). In that replay the bubble, the share of the time a rank idles, is
# (p − 1)/(m + p − 1) for p stages and m microbatches, for both schedules (asserted: 1/5 for p = 2, m = 4). What
# 1F1B changes is the memory: stage 0 holds the activations of every microbatch whose backward has not run yet,
# all m of them under GPipe, at most p under 1F1B (asserted).

# %% schedule-plot
import matplotlib.pyplot as plt

def replay(orders, forward=1, backward=2):
    """Each rank's recorded (kind, microbatch) order, each op started as early as its rank and its input allow."""
    p, done, slots = len(orders), {}, {r: [] for r in range(len(orders))}
    position, free = [0] * p, [0] * p
    while any(position[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while position[r] < len(orders[r]):
                kind, mb = orders[r][position[r]]
                needs = ("F", r - 1, mb) if kind == "F" and r > 0 else ("B", r + 1, mb) if kind == "B" and r < p - 1 else None
                if needs is not None and needs not in done:
                    break
                start = max(free[r], done.get(needs, 0))
                done[(kind, r, mb)] = free[r] = start + (forward if kind == "F" else backward)
                slots[r].append((kind, mb, start, free[r])); position[r] += 1; moved = True
        assert moved, f"the recorded orders wait on each other: {orders}"
    return slots

def bubble(slots):
    end = max(e for ops in slots.values() for *_, e in ops)
    return [1 - sum(e - s for *_, s, e in ops) / end for ops in slots.values()]

def in_flight(order):
    """The most microbatches whose forward ran and whose backward has not, at any moment."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1; peak = max(peak, held)
    return peak

orders = {name: [[(k, mb) for k, mb, *_ in recorded[r][name]] for r in range(world_size)] for name in recorded[0]}
fig, axes = plt.subplots(len(orders), 1, figsize=(11, 1.2 + 1.1 * world_size * len(orders)), sharex=True)
for ax, (name, per_rank) in zip(axes, orders.items()):
    slots = replay(per_rank)
    for r, ops in slots.items():
        for kind, mb, s, e in ops:
            ax.barh(r, e - s, left=s, color=f"C{mb}", alpha=1 if kind == "F" else 0.55, edgecolor="k")
            ax.text((s + e) / 2, r, f"{kind}{mb}", ha="center", va="center", fontsize=8)
    ax.set_yticks(range(world_size), [f"rank {r}\n(stage {r})" for r in range(world_size)]); ax.invert_yaxis()
    ax.set_title(f"{name}: bubble {bubble(slots)[0]:.0%} per rank; stage 0 holds up to {in_flight(per_rank[0])} "
                 f"microbatches' activations", fontsize=10)
axes[-1].set_xlabel("time (forward = 1 unit, backward = 2), replaying the order each rank recorded")
fig.tight_layout(); plt.show()

# %% schedule-assert
p, m = world_size, microbatches
def one_f_one_b(r):                               # warm-up forwards, then backward/forward pairs, then the last backwards
    warm = min(p - r, m)
    ops = [("F", i) for i in range(warm)] + [op for i in range(m - warm) for op in (("B", i), ("F", warm + i))]
    return ops + [("B", i) for i in range(m - warm, m)]
for r in range(p):
    assert orders["ScheduleGPipe"][r] == [("F", i) for i in range(m)] + [("B", i) for i in range(m)], orders
    assert orders["Schedule1F1B"][r] == one_f_one_b(r), orders
for name in orders:
    assert all(abs(b - (p - 1) / (m + p - 1)) < 1e-9 for b in bubble(replay(orders[name]))), (name, bubble(replay(orders[name])))
    assert abs(pipe_loss[name] - ref_loss) < 1e-5 and max(grad_err[r][name] for r in range(p)) < 1e-6, (pipe_loss, ref_loss, grad_err)
assert in_flight(orders["ScheduleGPipe"][0]) == m and in_flight(orders["Schedule1F1B"][0]) == min(p, m), orders
print(f"as drawn: both schedules idle (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.0%} of a step on an ideal machine; stage 0 holds "
      f"{m} microbatches under GPipe, {min(p, m)} under 1F1B; loss {pipe_loss['Schedule1F1B']:.6f} = one device's {ref_loss:.6f}")

# %% clock [markdown]
# ### The same steps on this machine's clock
# The ranks also recorded when each operation started and ended (`time.time()`: one clock for both
# processes of this machine). Drawn as they happened, the operations are separated by gaps the ideal machine
# does not have: the messages between the stages and the waits for a core, as long as this machine and its
# load make them. What holds on any machine, however busy, is the order the schedule imposes: no stage starts
# a microbatch's forward before the previous stage finished it, nor its backward before the next stage finished
# that (asserted below, on the clock). The idle share printed with it is this machine's, not the schedule's.

# %% clock-plot
fig, axes = plt.subplots(len(orders), 1, figsize=(11, 1.2 + 1.1 * world_size * len(orders)))
for ax, name in zip(axes, orders):
    t0 = min(s for r in range(world_size) for *_, s, e in recorded[r][name])
    for r in range(world_size):
        for kind, mb, s, e in recorded[r][name]:
            ax.barh(r, (e - s) * 1e3, left=(s - t0) * 1e3, color=f"C{mb}", alpha=1 if kind == "F" else 0.55, edgecolor="k")
    ax.set_yticks(range(world_size), [f"rank {r}" for r in range(world_size)]); ax.invert_yaxis()
    ax.set_title(f"{name}, as recorded: colour = microbatch, dark = forward, light = backward", fontsize=10)
axes[-1].set_xlabel("ms since the step's first forward, on this machine's clock")
fig.tight_layout(); plt.show()

# %% clock-assert
for name in orders:
    ran = {(kind, r, mb): (s, e) for r in range(p) for kind, mb, s, e in recorded[r][name]}
    for (kind, r, mb), (s, e) in ran.items():       # a forward after the previous stage's, a backward after the next one's
        needs = ("F", r - 1, mb) if kind == "F" and r > 0 else ("B", r + 1, mb) if kind == "B" and r < p - 1 else None
        assert needs is None or s >= ran[needs][1], (name, kind, r, mb, s, ran[needs])
    t0, t1 = min(s for s, _ in ran.values()), max(e for _, e in ran.values())
    busy = [sum(e - s for *_, s, e in recorded[r][name]) for r in range(p)]
    print(f"{name} on this machine's clock: every operation after the one it needs; from the first forward to the last "
          f"backward {(t1 - t0) * 1e3:.1f} ms, of which the ranks computed {', '.join(f'{b * 1e3:.1f} ms' for b in busy)} "
          f"(idle {', '.join(f'{1 - b / (t1 - t0):.0%}' for b in busy)}, the ideal machine's {(p - 1) / (m + p - 1):.0%})")

# %% pipeline-reading [markdown]
# More microbatches shrink the bubble (m = 8: 1/9) but make each one smaller, which a GPU computes less
# efficiently, and under GPipe every one of them holds its activations until the backwards start; 1F1B keeps
# that to p whatever m is. Interleaved schedules (`ScheduleInterleaved1F1B`, several stages per rank) and
# zero-bubble ones (`ScheduleZBVZeroBubble`) cut the bubble further; they drive the same `PipelineStage`
# objects, several per rank. On a
# cluster, pipeline stages often sit on different nodes: only the activations at the cut cross the network,
# once per microbatch, where tensor parallelism (lesson 16) needs collectives in every layer.

# %% zero [markdown]
# ## 2 · ZeRO-1, DDP and FSDP2: who keeps Adam's state
# Adam keeps two tensors per parameter (`exp_avg`, `exp_avg_sq`, each the parameter's size) and a `step`
# count (a 0-dim float32 tensor, 4 bytes, per parameter in torch 2.13): twice the model, in optimizer state alone.
# Three data-parallel jobs train the same model for `steps` steps, each rank on its own 32 digits:
# - **DDP** + `torch.optim.Adam`: every rank keeps all of the state;
# - **ZeRO-1**: DDP + `ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam)`. The gradients are
#   all-reduced as with DDP, but each rank keeps the state of, and updates, only the parameters it owns, then
#   **broadcasts** them to the others. It assigns **whole parameters**: largest first, each to the rank that
#   owns the fewest elements so far (torch 2.13, `_partition_parameters`), so the shares are only as even as
#   the parameters' sizes allow;
# - **FSDP2** (`fully_shard`, lesson 14): every parameter is split along dim 0, so its Adam state is too,
#   exactly 1/N per rank.
#
# Each rank measures the bytes of the tensors in its optimizer's state (for FSDP2 the local shards of the
# DTensors) and compares its parameters after the steps with DDP's.

# %% zero-ddp
# %%ddp -n $world_size --timeout 90 --pull zero -- --steps $steps
import argparse, copy, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from nbddp.datasets import digits
parser = argparse.ArgumentParser(); parser.add_argument("--steps", type=int); args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                           torch.nn.Linear(128, 10))
ddp = DDP(copy.deepcopy(base)); ddp_opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
zero_model = DDP(copy.deepcopy(base)); zero_opt = ZeroRedundancyOptimizer(zero_model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
fsdp = copy.deepcopy(base)
for layer in (fsdp[0], fsdp[2], fsdp[4]):
    fully_shard(layer)
fully_shard(fsdp); fsdp_opt = torch.optim.Adam(fsdp.parameters(), lr=1e-2)

def state_bytes(optimizer):
    """The bytes of every tensor in an optimizer's state on this rank (of a DTensor: its local shard)."""
    local = [v.to_local() if hasattr(v, "to_local") else v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in local)

X, y = digits("train")
for step in range(args.steps):
    xb, yb = X[(step * world + rank) * 32:][:32], y[(step * world + rank) * 32:][:32]
    for model, opt in ((ddp, ddp_opt), (zero_model, zero_opt), (fsdp, fsdp_opt)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
after = [p.detach() for p in ddp.parameters()]
zero = {"bytes": {"DDP": state_bytes(ddp_opt), "ZeRO-1": state_bytes(zero_opt.optim), "FSDP2": state_bytes(fsdp_opt)},
        "param_bytes": sum(p.numel() * p.element_size() for p in base.parameters()), "tensors": len(list(base.parameters())),
        "owned": [tuple(p.shape) for p in zero_opt.optim.param_groups[0]["params"]],
        "err": {"ZeRO-1": max((a - b).abs().max().item() for a, b in zip(after, zero_model.parameters())),
                "FSDP2": max((a - b.full_tensor()).abs().max().item() for a, b in zip(after, fsdp.parameters()))},
        "moved": max((a - b).abs().max().item() for a, b in zip(after, base.parameters()))}
print(f"rank {rank}: Adam state DDP {zero['bytes']['DDP']:,} B, ZeRO-1 {zero['bytes']['ZeRO-1']:,} B (owns {zero['owned']}), "
      f"FSDP2 {zero['bytes']['FSDP2']:,} B; parameters vs DDP's after {args.steps} steps: ZeRO-1 {zero['err']['ZeRO-1']:.1e}, "
      f"FSDP2 {zero['err']['FSDP2']:.1e}")
del ddp, zero_model, zero_opt
dist.destroy_process_group()

# %% zero-plot
import numpy as np
kinds = ["DDP", "ZeRO-1", "FSDP2"]
fig, ax = plt.subplots(figsize=(9, 3.4))
width = 0.8 / world_size
for r in range(world_size):
    bars = ax.bar(np.arange(3) + (r - (world_size - 1) / 2) * width, [zero[r]["bytes"][k] / 1024 for k in kinds], width,
                  color=f"C{r}", label=f"rank {r}")
    ax.bar_label(bars, [f"{zero[r]['bytes'][k] / 1024:.0f}" for k in kinds], fontsize=8)
ax.axhline(zero[0]["param_bytes"] / 1024, color="k", ls="--", lw=1, label="the parameters themselves")
ax.set_xticks(range(3), ["DDP: all of it", "ZeRO-1: whole parameters\nper rank", "FSDP2: 1/N of\nevery parameter"])
ax.set_ylabel("Adam state per rank (KiB)"); ax.legend(fontsize=8)
ax.set_title(f"optimizer state per rank, {world_size} ranks, {zero[0]['param_bytes'] / 1024:.0f} KiB of parameters")
fig.tight_layout(); plt.show()

# %% zero-reading [markdown]
# ZeRO-1's split is uneven here because the largest parameter, the 128×128 weight, is more than half of the
# elements: the rank that owns it keeps more state than the rest together. FSDP2 splits every parameter, so its
# shares are equal (plus the small `step` tensors each rank keeps for every parameter). The price differs
# too: ZeRO-1 sends what DDP sends plus a broadcast of the updated parameters; FSDP2 gathers parameters
# before every layer's forward and backward and reduce-scatters the gradients (lesson 14), and in return
# holds only 1/N of the parameters and gradients between layers as well. ZeRO-2 (gradients sharded too,
# parameters whole) has no class of its own in torch: FSDP1 called it `ShardingStrategy.SHARD_GRAD_OP`; the
# nearest in FSDP2 is `fully_shard(..., reshard_after_forward=False)`, which keeps a layer's gathered
# parameters from its forward to its backward instead of gathering them twice.

# %% check [markdown]
# ## Check
# The optimizer state's arithmetic, and ZeRO-1's and FSDP2's parameters against DDP's.

# %% zero-assert
param_bytes, tensors = zero[0]["param_bytes"], zero[0]["tensors"]
ddp_state = 2 * param_bytes + 4 * tensors                # exp_avg + exp_avg_sq + a 4-byte step per parameter
for r in range(world_size):
    assert zero[r]["bytes"]["DDP"] == ddp_state, (r, zero[r], ddp_state)
    assert zero[r]["bytes"]["FSDP2"] == 2 * param_bytes // world_size + 4 * tensors, (r, zero[r])
    assert zero[r]["err"]["ZeRO-1"] < 1e-6 and zero[r]["err"]["FSDP2"] < 1e-6 < zero[r]["moved"], zero[r]
assert sum(zero[r]["bytes"]["ZeRO-1"] for r in range(world_size)) == ddp_state, zero   # each state kept once, somewhere
assert sorted(s for r in range(world_size) for s in zero[r]["owned"]) == sorted([(128, 64), (128,), (128, 128), (128,), (10, 128), (10,)]), zero
print(f"as drawn: DDP keeps 2 × {param_bytes:,} B + {tensors} steps = {ddp_state:,} B of Adam state on every rank; ZeRO-1's ranks keep "
      f"{' + '.join(format(zero[r]['bytes']['ZeRO-1'], ',') for r in range(world_size))} = that once; FSDP2 1/{world_size} of the moments "
      f"plus its {tensors} steps ({zero[0]['bytes']['FSDP2']:,} B); after {steps} steps both equal DDP's parameters")

# %% exercise [markdown]
# ## Exercise
# Run the pipeline of section 1 so that on the ideal machine of the drawing each rank idles **less than 15 %**
# of a step, while stage 0 never holds more than **2** microbatches' activations, and its loss is still one
# device's. Pick the schedule and the number of microbatches (one that divides the batch of 64: equal
# microbatches, so the mean of their losses is the batch's), record each stage's order as in section 1,
# and pull it back.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your cell here, starting with
#   %%ddp -n $world_size --timeout 90 --pull ex_order,ex_loss@1,ex_ref@1
# where `ex_order` is this rank's list of ("F" or "B", microbatch) in the order its stage ran them, `ex_loss`
# the pipeline's mean loss and `ex_ref` one device's.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 90 --pull ex_order,ex_loss@1,ex_ref@1
import copy, torch, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from nbddp.datasets import digits
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
X, y = digits("train"); X, y = X[:64], y[:64]
ex_ref = torch.nn.functional.cross_entropy(model(X), y).item()
stage = PipelineStage(copy.deepcopy((model[:4], model[4:])[rank]), rank, 2, torch.device("cpu"))
ex_order = []
def logged(kind, call):
    def run(mb, *rest, **kw):
        ex_order.append((kind, mb)); return call(mb, *rest, **kw)
    return run
stage.forward_one_chunk, stage.backward_one_chunk = logged("F", stage.forward_one_chunk), logged("B", stage.backward_one_chunk)
pipe = Schedule1F1B(stage, n_microbatches=8, loss_fn=torch.nn.functional.cross_entropy)   # bubble 1/9, 2 in flight
losses = []
pipe.step(X) if rank == 0 else pipe.step(target=y, losses=losses)
ex_loss = torch.stack(losses).mean().item() if losses else None
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "ex_order" in globals() and "ex_loss" in globals(), "✗ nothing to check yet: your cell should end with --pull ex_order,ex_loss@1,ex_ref@1"
assert len(ex_order) == world_size and all(ex_order), f"✗ ex_order should be one non-empty list per rank, not {ex_order!r}"
ex_m = sum(kind == "F" for kind, _ in ex_order[0])
ex_bubble = max(bubble(replay(ex_order)))
assert ex_loss is not None and abs(ex_loss - ex_ref) < 1e-5, f"✗ the pipeline's loss {ex_loss} is not one device's {ex_ref:.6f}: the mean of the microbatches' losses on the last stage"
assert ex_bubble < 0.15, f"✗ with {ex_m} microbatches each rank idles {ex_bubble:.0%} of the step: (p-1)/(m+p-1) is below 15% from m = 6 on (1/7), and 64 splits into equal microbatches for m = 8"
assert in_flight(ex_order[0]) <= 2, f"✗ stage 0 held {in_flight(ex_order[0])} microbatches' activations at once: GPipe runs every forward before any backward; Schedule1F1B holds at most as many as there are stages"
print(f"✓ {ex_m} microbatches: each rank idles {ex_bubble:.0%} of the step, stage 0 holds at most {in_flight(ex_order[0])} "
      f"microbatches, and the loss {ex_loss:.6f} is one device's")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 90 --pull ex_order,ex_loss@1,ex_ref@1
import copy, torch, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from nbddp.datasets import digits
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
X, y = digits("train"); X, y = X[:64], y[:64]
ex_ref = torch.nn.functional.cross_entropy(model(X), y).item()
stage = PipelineStage(copy.deepcopy((model[:4], model[4:])[rank]), rank, 2, torch.device("cpu"))
ex_order = []
def logged(kind, call):
    def run(mb, *rest, **kw):
        ex_order.append((kind, mb)); return call(mb, *rest, **kw)
    return run
stage.forward_one_chunk, stage.backward_one_chunk = logged("F", stage.forward_one_chunk), logged("B", stage.backward_one_chunk)
pipe = ScheduleGPipe(stage, n_microbatches=8, loss_fn=torch.nn.functional.cross_entropy)
losses = []
pipe.step(X) if rank == 0 else pipe.step(target=y, losses=losses)
ex_loss = torch.stack(losses).mean().item() if losses else None
dist.destroy_process_group()
# expect: ✗ stage 0 held 8 .*GPipe

# %% mistake-few-microbatches tags=["mistake"]
# %%ddp -n $world_size --timeout 90 --pull ex_order,ex_loss@1,ex_ref@1
import copy, torch, torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from nbddp.datasets import digits
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
X, y = digits("train"); X, y = X[:64], y[:64]
ex_ref = torch.nn.functional.cross_entropy(model(X), y).item()
stage = PipelineStage(copy.deepcopy((model[:4], model[4:])[rank]), rank, 2, torch.device("cpu"))
ex_order = []
def logged(kind, call):
    def run(mb, *rest, **kw):
        ex_order.append((kind, mb)); return call(mb, *rest, **kw)
    return run
stage.forward_one_chunk, stage.backward_one_chunk = logged("F", stage.forward_one_chunk), logged("B", stage.backward_one_chunk)
pipe = Schedule1F1B(stage, n_microbatches=4, loss_fn=torch.nn.functional.cross_entropy)
losses = []
pipe.step(X) if rank == 0 else pipe.step(target=y, losses=losses)
ex_loss = torch.stack(losses).mean().item() if losses else None
dist.destroy_process_group()
# expect: ✗ with 4 microbatches each rank idles 20%
