# %% title [markdown]
# # 16 · Device meshes, DTensor and tensor parallelism
#
# Data parallelism (DDP, lesson 04; FSDP, lesson 14) splits the **batch**: every rank runs the whole model on
# its own samples. Past some size that is not enough: one layer's matrices no longer fit a device, or the
# all-reduce over hundreds of ranks costs more than it saves. Then the model itself is split, and ranks are
# arranged in a grid, a **device mesh**, whose dimensions each do one kind of parallelism: along one
# dimension ranks hold different samples (data parallel), along another different pieces of each layer
# (**tensor parallel**, Megatron-LM's scheme).
#
# torch describes both with the same two objects, and this lesson runs them on CPU with gloo (torch 2.13):
# - `init_device_mesh(device_type, shape, mesh_dim_names=...)`: the ranks as an n-dimensional grid, with one
#   process group per row along each dimension;
# - **DTensor** (`torch.distributed.tensor`): a tensor that knows its global shape and its **placement** on
#   each mesh dimension: `Shard(d)` (split along tensor dim `d`), `Replicate()` (a full copy) or
#   `Partial()` (each rank holds a summand; the value is their sum). FSDP2's parameters (lesson 14) are
#   DTensors; tensor parallelism (`parallelize_module`) makes them too.

# %% parameters tags=["parameters"]
world_size = 4      # the 2 × 2 mesh of section 1
tp_size = 2         # ranks of the tensor-parallel sections

# %% load-ext
# %load_ext nbddp

# %% meshes [markdown]
# ## 1 · Meshes, sub-meshes and placements
# Four ranks, two meshes. A **1-D** mesh of 4 is the whole world in a row. A **2-D** mesh of shape (2, 2)
# with the names `("dp", "tp")` lays the ranks out row by row: rank = 2·dp + tp, so rank 3 sits at (1, 1).
# `mesh["tp"]` is the **sub-mesh** of a rank's row (the ranks that share its dp coordinate: 0 and 1, or 2 and
# 3), `mesh["dp"]` the one of its column (0 and 2, or 1 and 3); each is a 1-D mesh with its own process group.
#
# Then a 4×4 tensor holding 0…15 is distributed twice. `distribute_tensor(t, mesh, placements)` takes one
# placement per mesh dimension and sends every rank its piece (from the first rank of each mesh dimension:
# `src_data_rank=0`). `[Shard(0), Shard(1)]`: rows split over dp, columns over tp, one 2×2 block per rank.
# `[Replicate(), Shard(0)]`: rows split over tp, the same piece on both ranks of a dp column.
# `full_tensor()` gathers the pieces back into the global tensor on every rank. Last, a **Partial** tensor:
# each rank of a tp row holds its own rank number as a summand; `redistribute(..., [Replicate()])` turns it
# into the sum, which is an all-reduce.

# %% meshes-ddp
# %%ddp -n $world_size --timeout 90 --pull placed,blocks,hsdp
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.fsdp import fully_shard
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()

line = init_device_mesh("cpu", (4,), mesh_dim_names=("world",))
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
placed = {"line": line.mesh.tolist(), "coordinate": mesh.get_coordinate(),
          "dp": mesh["dp"].mesh.tolist(), "tp": mesh["tp"].mesh.tolist()}
print(f"rank {rank}: in the 1-D mesh {placed['line']}; at {tuple(placed['coordinate'])} of the 2×2 mesh, its dp sub-mesh "
      f"{placed['dp']}, its tp sub-mesh {placed['tp']}")

t = torch.arange(16.0).reshape(4, 4)
blocks = {}
for name, placements in (("Shard(0), Shard(1)", [Shard(0), Shard(1)]), ("Replicate(), Shard(0)", [Replicate(), Shard(0)])):
    d = distribute_tensor(t, mesh, placements)
    blocks[name] = {"local": d.to_local().tolist(), "full_ok": torch.equal(d.full_tensor(), t)}
    print(f"rank {rank}: [{name}] holds {d.to_local().tolist()}")
summand = DTensor.from_local(torch.tensor([float(rank)]), mesh["tp"], [Partial()])
blocks["partial"] = {"mine": rank, "sum": summand.redistribute(mesh["tp"], [Replicate()]).to_local().item()}
print(f"rank {rank}: Partial summand {rank} -> Replicate {blocks['partial']['sum']}")

# HSDP: fully_shard on a 2-D mesh replicates over dim 0 (dp) and shards over dim 1 (tp here)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
X, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
reference.load_state_dict(model.state_dict())
torch.nn.functional.cross_entropy(reference(X), y).backward()        # the whole batch on one device
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
torch.nn.functional.cross_entropy(model(X[rank * 4:][:4]), y[rank * 4:][:4]).backward()   # 4 samples per rank
hsdp = {n: {"placements": [repr(p) for p in w.placements], "mine": tuple(w.to_local().shape), "full": tuple(w.shape),
            "grad_err": (w.grad.full_tensor() - dict(reference.named_parameters())[n].grad).abs().max().item()}
        for n, w in model.named_parameters()}
print(f"rank {rank}: HSDP 0.weight {hsdp['0.weight']['placements']}, this rank's piece {hsdp['0.weight']['mine']} "
      f"of {hsdp['0.weight']['full']}; gradients vs one device: {max(h['grad_err'] for h in hsdp.values()):.1e}")
dist.destroy_process_group()

# %% meshes-plot
import matplotlib.pyplot as plt
import numpy as np
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
for ax, name in zip(axes, ("Shard(0), Shard(1)", "Replicate(), Shard(0)")):
    holders = {}                                  # element value -> the ranks whose piece contains it
    for r in range(world_size):
        for value in np.ravel(blocks[r][name]["local"]):
            holders.setdefault(int(value), []).append(r)
    grid = np.array([holders[v][0] for v in range(16)]).reshape(4, 4)
    ax.imshow(grid, cmap="tab10", vmin=0, vmax=9, alpha=0.55)
    for v in range(16):
        ax.text(v % 4, v // 4, f"{v}\nrank{'s' * (len(holders[v]) > 1)} {','.join(map(str, holders[v]))}",
                ha="center", va="center", fontsize=8)
    ax.set_xticks(range(4)); ax.set_yticks(range(4)); ax.set_xlabel("column (tensor dim 1)"); ax.set_ylabel("row (tensor dim 0)")
    ax.set_title(f"[{name}] on mesh (dp=2, tp=2)", fontsize=10)
fig.suptitle("who holds which element of a 4×4 tensor (as the ranks reported their pieces)")
fig.tight_layout(); plt.show()

# %% meshes-assert
for r in range(world_size):
    assert tuple(placed[r]["coordinate"]) == (r // 2, r % 2) and placed[r]["line"] == [0, 1, 2, 3], placed[r]
    assert placed[r]["tp"] == [2 * (r // 2), 2 * (r // 2) + 1] and placed[r]["dp"] == [r % 2, r % 2 + 2], placed[r]
    dp, tp = r // 2, r % 2
    block = [[4 * i + j for j in (2 * tp, 2 * tp + 1)] for i in (2 * dp, 2 * dp + 1)]     # rows by dp, columns by tp
    assert blocks[r]["Shard(0), Shard(1)"]["local"] == block, blocks[r]
    assert blocks[r]["Replicate(), Shard(0)"]["local"] == [[4 * i + j for j in range(4)] for i in (2 * tp, 2 * tp + 1)], blocks[r]
    assert all(b["full_ok"] for k, b in blocks[r].items() if k != "partial"), blocks[r]
    assert blocks[r]["partial"]["sum"] == sum(placed[r]["tp"]), blocks[r]          # 0+1 or 2+3: an all-reduce
    for n, h in hsdp[r].items():
        assert h["placements"] == ["Replicate()", "Shard(dim=0)"] and h["mine"][0] == h["full"][0] // 2, (n, h)
        assert h["grad_err"] < 1e-6, (n, h)
print("as drawn: with [Shard(0), Shard(1)] each rank holds one 2×2 block; with [Replicate(), Shard(0)] ranks r and r+2 "
      "hold the same two rows; HSDP's parameters are (Replicate(), Shard(0)) and its gradients equal one device's")

# %% meshes-reading [markdown]
# **HSDP** (hybrid sharded data parallel) is FSDP on a 2-D mesh: `fully_shard(model, mesh=mesh)` with a 2-D mesh
# **replicates** every parameter along mesh dim 0 and **shards** it along dim 1 (`(Replicate(), Shard(0))`,
# as asserted; "dp" and "tp" are only names: here both dimensions hold data-parallel ranks). All four ranks
# take different samples; a gradient is reduce-scattered within a shard group (here a row of 2) and then
# all-reduced across the replicas (a column). On a cluster the shard group is a node (fast links) and the
# replicas span nodes, so FSDP's all-gathers never leave a node. It runs on CPU/gloo in torch 2.13, and its gradients equal one
# device's on the whole batch (asserted above, to 1e-6).

# %% tp [markdown]
# ## 2 · Tensor parallelism: one block split over two ranks
# A transformer block without attention: `x + down(relu(up(norm(x))))`, `up` 16→64, `down` 64→16. Megatron-LM's
# split needs one all-reduce per block in forward:
# - `up` is **column-wise** parallel (`ColwiseParallel`): each rank holds 32 of its 64 output rows, so it
#   computes 32 of the 64 hidden features, from the full input; the ReLU works feature by feature, so it
#   needs nothing from the other rank;
# - `down` is **row-wise** parallel (`RowwiseParallel`): each rank holds the 32 input columns that match its
#   32 features and computes a *partial* sum of the output; one **all-reduce** adds the two (`Partial` →
#   `Replicate`). In backward, the same happens once at `up`'s input.
#
# `parallelize_module(block, mesh, plan)` turns those layers' parameters into DTensors (`Shard(0)` for `up`,
# `Shard(1)` for `down`'s weight) and installs the redistributions. `CommDebugMode` counts the collectives
# DTensor issues. The unsharded block, same seed, same input, is the reference for the output and for
# every gradient.
#
# **Sequence parallelism** goes one step further: the parts between the matrix products (the LayerNorm, the
# residual) do not need the whole sequence on each rank, so each rank keeps only its half of the positions
# there. `SequenceParallel()` on the norm, `ColwiseParallel(input_layouts=Shard(1))` all-**gathers** the
# sequence before `up`, and `RowwiseParallel(output_layouts=Shard(1))` replaces the all-reduce with a
# **reduce-scatter** that leaves each rank its half of the positions (same bytes, activations halved between
# the layers). It runs on gloo too.

# %% tp-ddp
# %%ddp -n $tp_size --timeout 60 --pull tp@0,sp@0
import copy, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))

class Block(torch.nn.Module):
    def __init__(self, d=16, hidden=64):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

def counts(mode):
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}

def grad_errors(block, reference):
    full = lambda g: g.full_tensor() if hasattr(g, "full_tensor") else g
    return {n: (full(p.grad) - dict(reference.named_parameters())[n].grad).abs().max().item() for n, p in block.named_parameters()}

torch.manual_seed(0)
reference = Block()
x = torch.randn(4, 8, 16, requires_grad=True)       # batch 4, sequence 8, features 16: the same on both ranks
y_ref = reference(x)
y_ref.sum().backward()

block = copy.deepcopy(reference); block.zero_grad()
parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
with CommDebugMode() as forward:
    y = block(x)
with CommDebugMode() as backward:
    y.sum().backward()
tp = {"shapes": {n: (tuple(p.to_local().shape), repr(p.placements[0])) for n, p in block.named_parameters() if hasattr(p, "to_local")},
      "out_err": (y - y_ref).abs().max().item(), "grad_err": grad_errors(block, reference),
      "forward": counts(forward), "backward": counts(backward)}
print(f"rank {rank}: TP up.weight {tp['shapes']['up.weight']}, down.weight {tp['shapes']['down.weight']}; output vs unsharded "
      f"{tp['out_err']:.1e}, gradients {max(tp['grad_err'].values()):.1e}; collectives forward {tp['forward']}, backward {tp['backward']}")

sp_block = copy.deepcopy(reference); sp_block.zero_grad()
parallelize_module(sp_block, mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                                    "down": RowwiseParallel(output_layouts=Shard(1))})
x_mine = x.chunk(dist.get_world_size(), dim=1)[rank]          # this rank's 4 of the 8 positions
with CommDebugMode() as forward:
    y_mine = x_mine + sp_block.down(torch.relu(sp_block.up(sp_block.norm(x_mine))))
with CommDebugMode() as backward:
    y_mine.sum().backward()
sp = {"shape": tuple(y_mine.shape), "out_err": (y_mine - y_ref.chunk(dist.get_world_size(), dim=1)[rank]).abs().max().item(),
      "grad_err": grad_errors(sp_block, reference), "norm_grad": repr(sp_block.norm.weight.grad.placements[0]),
      "forward": counts(forward), "backward": counts(backward)}
print(f"rank {rank}: SP output {sp['shape']} (its half of the positions) vs the unsharded block's half {sp['out_err']:.1e}, "
      f"gradients {max(sp['grad_err'].values()):.1e} (the norm's: {sp['norm_grad']}); collectives forward {sp['forward']}, "
      f"backward {sp['backward']}")
dist.destroy_process_group()

# %% tp-reading [markdown]
# With sequence parallelism the LayerNorm's gradient is `Partial(sum)` on each rank (printed above: each
# rank saw half of the positions); `full_tensor()` adds the halves, and that sum is the unsharded block's
# gradient (asserted in the check below). On GPUs, tensor parallelism is kept inside a node (NVLink): its
# collectives sit on the critical path of every layer, forward and backward, where DDP's overlap with
# backward. A real model combines it with data parallelism on a 2-D mesh: `parallelize_module(model,
# mesh["tp"], plan)`, then `fully_shard(model, mesh=mesh["dp"])`.

# %% check [markdown]
# ## Check
# The tensor- and sequence-parallel blocks against the unsharded one: shards, values, collectives.

# %% tp-assert
assert tp["shapes"] == {"up.weight": ((32, 16), "Shard(dim=0)"), "up.bias": ((32,), "Shard(dim=0)"),
                        "down.weight": ((16, 32), "Shard(dim=1)"), "down.bias": ((16,), "Replicate()")}, tp["shapes"]
assert tp["out_err"] < 1e-5 and max(tp["grad_err"].values()) < 1e-5, tp
assert tp["forward"] == {"all_reduce": 1} and tp["backward"] == {"all_reduce": 1}, tp
assert sp["shape"] == (4, 8 // tp_size, 16) and sp["out_err"] < 1e-5 and max(sp["grad_err"].values()) < 1e-5, sp
assert sp["forward"] == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1} and sp["norm_grad"] == "Partial(sum)", sp
print(f"ok: tensor-parallel output and every gradient equal the unsharded block's (to {max(tp['out_err'], *tp['grad_err'].values()):.0e}), "
      f"with one all-reduce in forward and one in backward; sequence parallel: an all-gather and a reduce-scatter instead, "
      f"the same values (to {max(sp['out_err'], *sp['grad_err'].values()):.0e})")

# %% exercise [markdown]
# ## Exercise
# A plan decides how many collectives a block costs. Parallelize the same `Block` over `tp_size` ranks so
# that its output equals the unsharded block's **with one all-reduce in forward and nothing else**, and
# report the forward's collectives (`CommDebugMode`) and the largest output difference.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your cell here, starting with
#   %%ddp -n $tp_size --timeout 60 --pull plan_comms@0,plan_err@0
# where `plan_comms` is {collective name: count} of the forward (as `counts(forward)` above gives it) and
# `plan_err` the largest |output - unsharded output|.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $tp_size --timeout 60 --pull plan_comms@0,plan_err@0
import copy, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))

class Block(torch.nn.Module):
    def __init__(self, d=16, hidden=64):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

torch.manual_seed(0)
reference = Block(); x = torch.randn(4, 8, 16)
block = parallelize_module(copy.deepcopy(reference), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
with CommDebugMode() as forward:
    y = block(x)
plan_comms = {str(op).split(".")[-1]: n for op, n in forward.get_comm_counts().items()}
plan_err = (y - reference(x)).abs().max().item()
print(f"rank {dist.get_rank()}: forward collectives {plan_comms}, output vs unsharded {plan_err:.1e}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "plan_comms" in globals() and "plan_err" in globals(), "✗ nothing to check yet: your cell should end with --pull plan_comms@0,plan_err@0"
assert plan_err < 1e-5, f"✗ the output differs from the unsharded block's by {plan_err:.1e}: same seed, same input on every rank?"
assert plan_comms == {"all_reduce": 1}, f"✗ the forward issued {plan_comms}, not one all_reduce: each ColwiseParallel layer whose output is gathered costs an all-gather; ColwiseParallel on up, then RowwiseParallel on down keeps the hidden features split between them"
print(f"✓ the block's output equals the unsharded one's ({plan_err:.0e}) for one all-reduce in forward: Megatron's column-then-row split")

# %% mistake tags=["mistake"]
# %%ddp -n $tp_size --timeout 60 --pull plan_comms@0,plan_err@0
import copy, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))

class Block(torch.nn.Module):
    def __init__(self, d=16, hidden=64):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))

torch.manual_seed(0)
reference = Block(); x = torch.randn(4, 8, 16)
block = parallelize_module(copy.deepcopy(reference), mesh, {"up": ColwiseParallel(output_layouts=Replicate()),
                                                            "down": ColwiseParallel(output_layouts=Replicate())})
with CommDebugMode() as forward:
    y = block(x)
plan_comms = {str(op).split(".")[-1]: n for op, n in forward.get_comm_counts().items()}
plan_err = (y - reference(x)).abs().max().item()
dist.destroy_process_group()
# expect: ✗ the forward issued .*all_gather
