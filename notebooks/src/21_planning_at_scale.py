# %% title [markdown]
# # 21 · Planning a job at its real scale: DDP, ZeRO-1, FSDP2, HSDP and TP on 8, 64 and 512 ranks
#
# Before booking 64 nodes, two questions: does the model's **training state fit** on each GPU, and **how many
# bytes** does each rank send per step? Both follow from how a strategy splits the state. With Adam in float32
# a parameter costs 16 bytes of training state: 4 for itself, 4 for its gradient, 8 for Adam's two moments.
#
# | strategy | each rank holds | collectives of a step |
# |---|---|---|
# | DDP | everything: 16·P | all-reduce of the gradients |
# | ZeRO-1 (`ZeroRedundancyOptimizer`) | parameters and gradients, Adam's state of **its part** only | DDP's all-reduce, then each part's new values broadcast by its owner |
# | FSDP2 (`fully_shard`) | 1/N of everything | per layer: all-gather (forward), all-gather again (backward), reduce-scatter |
# | HSDP (`fully_shard` on a 2-D mesh) | 1/8 of everything (sharded within a node of 8) | FSDP2's within the node, an all-reduce of the shard across nodes |
# | TP (`parallelize_module`, 8 per node) | 1/8 of the blocks' matrices, the embeddings whole | all-reduces of **activations** in every block |
#
# This machine cannot run 512 ranks, but **`%%ddp --fake`** runs rank 0 of a 512-rank world: every process
# group lands on torch's *fake* backend (collectives return at once, moving nothing), models built on the
# `meta` device cost no memory, and what the rank holds — its real shards, made by the real `fully_shard` —
# is counted. Nothing runs at that scale: these are **shapes and bytes, not timings**.

# %% parameters tags=["parameters"]
world_size = 2
world_sizes = [8, 64, 512]

# %% load-ext
# %load_ext nbddp

# %% fake [markdown]
# ## 1 · One rank of 512
# The cell below is written as for the cluster (`init_device_mesh`, `fully_shard`, two training steps). With
# `--fake` it runs as rank 0 of 512; after it, the rank reports what it holds and the collectives of its
# last step. A `Linear(512, 512)` split by rows over 512 ranks leaves one row (512 numbers) and one bias
# element on each rank.
#
# What a rank holds *between* steps is not what it needs *during* one. To compute a layer, FSDP2 all-gathers
# the whole layer; in the backward it holds whole layers and whole gradients (a reduce-scatter's input is
# the full gradient) at once. The report's **peak memory of a step** (torch's `MemTracker` counting the
# rank's live tensors) shows it: at least two whole layers, hundreds of times the shards.

# %% fake-ddp
# %%ddp -n 512 --fake --timeout 60
import torch, torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (512,))
model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(4, 512)).sum().backward()
    opt.step()

# %% fake-assert
held = _ddp.rank(0).fake
per_layer = 512 + 1                                   # one row of the weight, one bias element
assert held["numel"] == 2 * per_layer, held
assert (held["params"], held["grads"]) == (2 * per_layer * 4, 2 * per_layer * 4), held
assert held["optim"] == 2 * 2 * per_layer * 4 + 4 * 4, held   # two moments, and a 0-d step per tensor
last = [c for c in held["collectives"] if c[3] == held["steps"] - 1]
gathers = [c for c in last if c[0] == "all_gather"]
assert len(gathers) == 4 and all(c[1] == 512 * per_layer * 4 for c in gathers), last  # each a whole layer
peak = held["peaks"][held["steps"] - 1]["total"]     # the last step's, as the report says
layer = 512 * per_layer * 4
assert peak >= 2 * layer, f"✗ the step's peak, {peak:,} bytes, is under two whole layers ({2 * layer:,})"
assert peak > 100 * held["params"], f"✗ the peak ({peak:,}) is not hundreds of times the shards ({held['params']:,})"
print(f"rank 0 of 512 holds {held['numel']} of the model's {2 * (512 * 512 + 512):,} numbers; "
      f"its last step gathered {len(gathers)} whole layers of {gathers[0][1] / 2**20:.2f} MiB, "
      f"and its peak was {peak / 2**20:.2f} MiB: {peak / layer:.1f} whole layers")

# %% plan [markdown]
# ## 2 · Memory per rank: GPT-2-sized and 7B-sized, on 8, 64 and 512 ranks
# Two stacks with a transformer's weight matrices, built on `meta` (their forward is never run, so the
# blocks are plain lists of matrices): **GPT-2-sized** (12 blocks of width 768, vocabulary 50,257, an untied
# output layer: 162 M parameters) and **7B-sized** (32 blocks of width 4,096 with a gated MLP of 11,008,
# vocabulary 32,000: 6.7 B). For each world size one fake rank applies each strategy for real and counts
# the numbers it holds: `nbddp.run(plan, n=N, fake=True)`.

# %% plan-code
import math
import nbddp

SIZES = {"GPT-2": (12, 768, 3072, 50257, False), "7B": (32, 4096, 11008, 32000, True)}

def plan(sizes):
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("nccl")          # as on the cluster; --fake puts it on the fake backend
    nodes = init_device_mesh("cpu", (dist.get_world_size() // 8, 8), mesh_dim_names=("across", "within"))

    def build(layers, d, ff, vocab, gated):
        with torch.device("meta"):
            def block():   # q,k,v in one matrix, the attention's output, the MLP's input(s) and output
                up = [nn.Linear(d, ff, bias=False) for _ in range(2 if gated else 1)]
                return nn.Sequential(nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False), *up,
                                     nn.Linear(ff, d, bias=False))
            return nn.Sequential(nn.Embedding(vocab, d), *[block() for _ in range(layers)], nn.Linear(d, vocab, bias=False))

    def held(model):                          # this rank's numbers: a DTensor's local shard only
        return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())

    out = {}
    for name, shape in sizes.items():
        m = build(*shape)
        row = {"P": held(m), "shapes": [tuple(p.shape) for p in m.parameters()], "ddp": held(DDP(m))}
        zero = ZeroRedundancyOptimizer(list(m.parameters()), optimizer_class=torch.optim.AdamW)
        row["zero1_part"] = sum(p.numel() for g in zero.optim.param_groups for p in g["params"])
        for strategy, mesh in (("fsdp2", None), ("hsdp", nodes)):
            m = build(*shape)
            for block in list(m)[1:-1]:
                fully_shard(block, mesh=mesh)
            fully_shard(m, mesh=mesh)
            row[strategy] = held(m)
        m = build(*shape)
        for block in list(m)[1:-1]:           # q,k,v and the MLP's inputs by columns, their outputs by rows
            cols = {str(i): ColwiseParallel() for i in range(len(block) - 1) if i != 1}
            parallelize_module(block, nodes["within"], {**cols, "1": RowwiseParallel(),
                                                        str(len(block) - 1): RowwiseParallel()})
        row["tp"] = held(m)
        out[name] = row
    return out

measured = {n: nbddp.run(plan, n=n, fake=True, args=(SIZES,), timeout=120, sinks=[]).values[0] for n in world_sizes}
for name in SIZES:
    print(f"{name}: {measured[8][name]['P'] / 1e9:.3f} B parameters")

# %% plan-formulas [markdown]
# Each number has a formula, checked below against what the fake rank holds:
# - **DDP**: all P numbers.
# - **ZeRO-1**: torch's `ZeroRedundancyOptimizer` gives whole tensors to ranks, largest first, each to the
#   rank with the least so far. Rank 0 gets the largest tensor (the embedding) at any N, so its Adam state
#   never shrinks below that; with more ranks than tensors (50 in the GPT-2-sized model, 162 in the
#   7B-sized one) the ranks past them get none.
# - **FSDP2**: every tensor split by rows into N pieces of ⌈rows/N⌉ (rank 0's piece is a full one).
# - **HSDP**: the same with 8 in place of N: it does not shrink with more nodes.
# - **TP**: each block's matrices split 8 ways; the embedding and output layer whole.

# %% plan-assert
def zero1_part(shapes, n):
    """Rank 0's numbers under ZeroRedundancyOptimizer's rule: largest first, each to the least-loaded rank."""
    loads, mine = [0] * n, 0
    for numel in sorted((math.prod(s) for s in shapes), reverse=True):
        r = loads.index(min(loads))
        loads[r] += numel
        mine += numel if r == 0 else 0
    return mine

def fsdp_part(shapes, n):
    return sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)

def tp_part(shapes):
    return sum(math.prod(s) for s in shapes[1:-1]) // 8 + math.prod(shapes[0]) + math.prod(shapes[-1])

GiB = 2**30
memory = {}
for n, rows in measured.items():
    for name, r in rows.items():
        P, shapes = r["P"], r["shapes"]
        assert len(shapes) == {"GPT-2": 50, "7B": 162}[name] and max(map(math.prod, shapes)) == math.prod(shapes[0])
        assert r["ddp"] == P and r["zero1_part"] == zero1_part(shapes, n) >= math.prod(shapes[0]), (n, name, r)
        assert r["fsdp2"] == fsdp_part(shapes, n) and r["hsdp"] == fsdp_part(shapes, 8), (n, name, r)
        assert r["tp"] == tp_part(shapes), (n, name, r)
        memory[name, n] = {"DDP": 16 * P, "ZeRO-1": 8 * P + 8 * r["zero1_part"], "FSDP2": 16 * r["fsdp2"],
                           "HSDP": 16 * r["hsdp"], "TP": 16 * r["tp"]}
for name in SIZES:
    print(name + ": GiB of training state per rank")
    for strategy in memory[name, 8]:
        print(f"  {strategy:7}" + "".join(f"{n:5} ranks {memory[name, n][strategy] / GiB:8.2f}" for n in world_sizes))

# %% plan-plot
import matplotlib.pyplot as plt
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for ax, name in zip(axes, SIZES):
    for i, strategy in enumerate(memory[name, 8]):
        ax.plot(world_sizes, [memory[name, n][strategy] / GiB for n in world_sizes], "o-", color=f"C{i}", label=strategy)
    ax.axhline(80e9 / GiB, color="k", ls="--", lw=1, label="an 80 GB GPU")
    ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xticks(world_sizes, world_sizes)
    ax.set_xlabel("ranks"); ax.set_ylabel("GiB per rank (params + grads + Adam, fp32)"); ax.set_title(name)
axes[0].legend(fontsize=8)
fig.tight_layout(); plt.show()

# %% plan-claims [markdown]
# What the figure says, asserted below: a 7B model's training state never fits an 80 GB GPU under DDP, at any
# number of ranks (16 bytes × 6.7 B ≈ 100 GiB per rank). ZeRO-1 fits it, but its parameters and gradients
# stay whole, so it never goes below 8 bytes × 6.7 B ≈ 50 GiB, leaving little for activations. FSDP2 fits
# it from 8 ranks, and keeps shrinking; HSDP stays where 8 ranks put it.

# %% plan-claims-assert
big = memory["7B", 8]["DDP"]
assert all(memory["7B", n]["DDP"] == big > 80e9 for n in world_sizes), "DDP: the same, too much, at every N"
P7 = measured[8]["7B"]["P"]
assert all(8 * P7 < memory["7B", n]["ZeRO-1"] < 80e9 for n in world_sizes), "ZeRO-1: above 8 bytes a parameter, under 80 GB"
assert memory["7B", 8]["FSDP2"] < 80e9 and memory["7B", 512]["FSDP2"] < memory["7B", 64]["FSDP2"] < memory["7B", 8]["FSDP2"]
assert len({memory["7B", n]["HSDP"] for n in world_sizes}) == 1
print(f"7B per rank: DDP {big / GiB:.0f} GiB; ZeRO-1 {memory['7B', 512]['ZeRO-1'] / GiB:.1f} GiB on 512 ranks; FSDP2 {memory['7B', 8]['FSDP2'] / GiB:.1f} GiB on 8 ranks, "
      f"{memory['7B', 512]['FSDP2'] / GiB:.2f} GiB on 512")

# %% bytes [markdown]
# ## 3 · Bytes each rank sends per step
# A ring collective over g ranks sends (g−1)/g of its buffer from each rank for an all-gather or a
# reduce-scatter, twice that for an all-reduce. So per step, with G = 4·P bytes of float32 gradients:
# DDP sends 2·(N−1)/N·G; FSDP2 3·(N−1)/N·G (two all-gathers and a reduce-scatter of every layer); HSDP
# 3·7/8·G within its node and 2·(R−1)/R·G/8 across its R = N/8 nodes. Per rank, that hardly depends on N
# (DDP: 1.75·G on 8 ranks, just under 2·G on 512): what grows with N is the number of ranks sending. ZeRO-1
# and TP are left out of the figure: torch's ZeRO-1 adds a broadcast of each part by its owner (the owner
# sends, the rest receive), and TP's bytes are activations, set by the batch and sequence, not by the model.
# First the **counts and buffers** these
# formulas assume, from the collectives a fake rank of 8 records on a small model (three steps of each
# strategy in one world; the last one's collectives counted).

# %% bytes-small
def small_steps():
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    nodes = init_device_mesh("cpu", (2, 4), mesh_dim_names=("across", "within"))
    made = {"DDP": lambda m: DDP(m), "FSDP2": lambda m: m, "HSDP": lambda m: m}
    for strategy, wrap in made.items():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
        if strategy != "DDP":
            for layer in m:
                fully_shard(layer, mesh=nodes if strategy == "HSDP" else None)
            fully_shard(m, mesh=nodes if strategy == "HSDP" else None)
        m = wrap(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(4, 64)).sum().backward()
            opt.step()
    return list(made)

small = nbddp.run(small_steps, n=8, fake=True, timeout=120, sinks=[]).ranks[0].fake
G_small = 4 * 2 * (64 * 64 + 64)
steps = {}
for i, strategy in enumerate(["DDP", "FSDP2", "HSDP"]):
    last = [c for c in small["collectives"] if c[3] == 3 * i + 2]
    steps[strategy] = {(kind, group): (sum(1 for c in last if (c[0], c[2]) == (kind, group)),
                                       sum(c[1] for c in last if (c[0], c[2]) == (kind, group)))
                       for kind, _, group, _ in last}
    print(f"{strategy}: {steps[strategy]}  ((kind, group size): (count, buffer bytes))")

# %% bytes-small-assert
assert steps["DDP"] == {("all_reduce", 8): (1, G_small)}, steps["DDP"]            # one bucket: all gradients
assert steps["FSDP2"] == {("all_gather", 8): (4, 2 * G_small), ("reduce_scatter", 8): (2, G_small)}, steps["FSDP2"]
assert steps["HSDP"] == {("all_gather", 4): (4, 2 * G_small), ("reduce_scatter", 4): (2, G_small),
                         ("all_reduce", 2): (2, G_small // 4)}, steps["HSDP"]
print("the buffers a step moves: DDP G, FSDP2 2G gathered + G scattered, HSDP the same within a node "
      "and G/4 (a 4-rank node's shard) all-reduced across nodes")

# %% bytes-big
def ring(kind, nbytes, g):
    return nbytes * (g - 1) / g * (2 if kind == "all_reduce" else 1)

sent = {}
for n in world_sizes:
    G = 4 * measured[n]["7B"]["P"]
    R = n // 8
    sent[n] = {"DDP": ring("all_reduce", G, n), "FSDP2": 2 * ring("all_gather", G, n) + ring("reduce_scatter", G, n),
               "HSDP": 3 * ring("all_gather", G, 8) + ring("all_reduce", G / 8, R)}
fig, ax = plt.subplots(figsize=(6, 3.6))
for i, strategy in enumerate(sent[8]):
    ax.plot(world_sizes, [sent[n][strategy] / GiB for n in world_sizes], "o-", color=f"C{[0, 2, 3][i]}", label=strategy)
ax.set_xscale("log", base=2); ax.set_xticks(world_sizes, world_sizes); ax.set_ylim(0)
ax.set_xlabel("ranks"); ax.set_ylabel("GiB sent per rank and step"); ax.set_title("7B: bytes each rank sends per step")
ax.legend(fontsize=8); fig.tight_layout(); plt.show()
G7 = 4 * measured[8]["7B"]["P"]
assert all(abs(sent[n]["FSDP2"] / sent[n]["DDP"] - 1.5) < 1e-9 for n in world_sizes)   # 3/2 of DDP's, at any N
assert all(1.75 * G7 - 1 <= sent[n]["DDP"] < 2 * G7 for n in world_sizes)   # 1.75 G to 2 G: hardly N's
print(f"7B, per rank and step: DDP {sent[512]['DDP'] / GiB:.1f} GiB, FSDP2 {sent[512]['FSDP2'] / GiB:.1f} GiB "
      f"(1.5×), HSDP {sent[512]['HSDP'] / GiB:.1f} GiB on 512 ranks")

# %% real [markdown]
# ## 4 · The same cell, for real, on 2 CPU ranks
# The cell of section 1 with a world of 2 and gloo: no fake backend, real all-gathers. Each rank counts the
# numbers it holds itself: half of each layer, ⌈512/2⌉ rows and ⌈512/2⌉ bias elements, the formula of
# section 2 with N = 2.

# %% real-ddp
# %%ddp -n $world_size --timeout 60 --pull real_held@0
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import os
mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
model = nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters())
for _ in range(2):
    model(torch.randn(4, 512)).sum().backward()
    opt.step()
real_held = sum(p.to_local().numel() for p in model.parameters())
print(f"rank {dist.get_rank()} of {dist.get_world_size()} holds {real_held} numbers")

# %% real-assert
assert real_held == fsdp_part([(512, 512), (512,), (512, 512), (512,)], world_size), real_held
print(f"✓ for real on {world_size} ranks: {real_held} numbers, as the formula says")

# %% check [markdown]
# ## Check

# %% check-code
assert _ddp.ok and real_held == fsdp_part([(512, 512), (512,)] * 2, world_size)
assert set(memory) == {(name, n) for name in SIZES for n in world_sizes}
assert all(memory[k]["FSDP2"] <= memory[k]["HSDP"] <= memory[k]["DDP"] for k in memory)     # more sharding, less held
assert all(memory[name, 8]["FSDP2"] == memory[name, 8]["HSDP"] for name in SIZES)          # on one node they agree
print("ok: every per-rank number is its strategy's formula; FSDP2 ≤ HSDP ≤ DDP everywhere; on 8 ranks "
      "FSDP2 and HSDP are one thing; the 2-rank real run holds what the formula says")

# %% exercise [markdown]
# ## Exercise
# HSDP on 64 ranks (8 nodes of 8): how many **bytes** of training state (float32 parameters, gradients and
# Adam's two moments) does rank 0 hold for the 7B-sized model? Compute it from the shapes in
# `measured[64]["7B"]["shapes"]` and the rule of section 2, into a variable `hsdp_7b_64`.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your computation here: hsdp_7b_64 = ...

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-code tags=["solution"]
shapes = measured[64]["7B"]["shapes"]
hsdp_7b_64 = 16 * sum(math.ceil(s[0] / 8) * math.prod(s[1:]) for s in shapes)   # sharded within a node of 8
print(f"{hsdp_7b_64 / GiB:.2f} GiB")

# %% check-answer tags=["check"]
assert "hsdp_7b_64" in globals(), "✗ nothing to check yet: compute hsdp_7b_64 in the cell above"
assert hsdp_7b_64 != 16 * fsdp_part(measured[64]["7B"]["shapes"], 64), "✗ that is FSDP2 over all 64 ranks: HSDP shards only within a node of 8 and replicates across nodes"
assert hsdp_7b_64 != 4 * measured[64]["7B"]["hsdp"], "✗ that is the parameters alone: add their gradients and Adam's two moments (16 bytes a number in all)"
assert hsdp_7b_64 == 16 * measured[64]["7B"]["hsdp"], f"✗ {hsdp_7b_64:,} bytes is not what the fake rank holds ({16 * measured[64]['7B']['hsdp']:,}): ⌈rows/8⌉ rows of each tensor, 16 bytes a number"
print(f"✓ HSDP, 7B, 64 ranks: {hsdp_7b_64 / GiB:.2f} GiB per rank, the same as on 8 ranks")

# %% mistake tags=["mistake"]
hsdp_7b_64 = 16 * sum(math.ceil(s[0] / 64) * math.prod(s[1:]) for s in measured[64]["7B"]["shapes"])
# expect: ✗ that is FSDP2 over all 64 ranks
