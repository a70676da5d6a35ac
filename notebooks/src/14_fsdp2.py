# %% title [markdown]
# # 14 · FSDP2: sharding parameters, gradients and optimizer state (`fully_shard`)
#
# DDP keeps a **full** copy of the model on every rank: its parameters, their gradients and the optimizer
# state (Adam: two more tensors per parameter). With *N* ranks that is *N* copies of everything. **FSDP**
# (Fully Sharded Data Parallel, ZeRO stage 3) keeps only **1/N** of each on a rank and pays for it with
# more communication:
#
# | when | DDP | FSDP |
# |---|---|---|
# | a layer's forward | — | **all-gather** its parameters, compute, free the gathered copy |
# | a layer's backward | its gradients fill **buckets**; each full bucket is **all-reduced** while backward goes on (lesson 12) | all-gather again, compute, **reduce-scatter** the gradients: each rank keeps the average of its own 1/N |
# | end of `loss.backward()` | wait for the last buckets' all-reduce | wait for the last reduce-scatter |
# | `opt.step()` | on the full tensors | on the rank's shard only (so the optimizer state is sharded too) |
#
# **FSDP2** is `torch.distributed.fsdp.fully_shard` (torch ≥ 2.6 public): it changes a module in place, and each
# parameter becomes a **DTensor** — a tensor that knows its global shape and how it is laid out over a
# *device mesh* (here: `Shard(0)`, split along dim 0, one piece per rank). It replaces FSDP1's
# `FullyShardedDataParallel` wrapper (flat parameters, `use_orig_params`). It runs on CPU with gloo in torch
# 2.13, which this lesson checks: all-gather and reduce-scatter are gloo collectives too.
#
# The model is a small classifier of real data: `nbddp.datasets.digits()`, 1,797 handwritten digits of 8×8
# pixels (UCI, shipped with nbddp), 1,500 to train on and 297 held out.

# %% parameters tags=["parameters"]
world_size = 2
epochs = 3
out_dir = "runs/14"

# %% load-ext
# %load_ext nbddp

# %% what-each-rank-holds [markdown]
# ## 1 · What each rank holds
# `fully_shard` is applied bottom-up: to each layer (each becomes a unit that is gathered on its own, just in
# time), then to the root (for whatever is left). Each rank then reports every parameter's type, its global
# shape, the shape of **its** piece, and the placement. A pre-forward hook on the last layer shows what that
# layer sees while it computes: the gathered, full weight as a plain tensor.

# %% what-each-rank-holds-ddp
# %%ddp -n $world_size --timeout 60 --pull held,inside
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
rank = dist.get_rank()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
inside = {}
model[2].register_forward_pre_hook(
    lambda layer, args: inside.update(type=type(layer.weight).__name__, shape=tuple(layer.weight.shape)))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)

held = {}
for name, p in model.named_parameters():
    held[name] = {"type": type(p).__name__, "full": tuple(p.shape), "mine": tuple(p.to_local().shape),
                  "placement": repr(p.placements[0]), "mesh": p.device_mesh.size()}
    print(f"rank {rank}: {name:9} {type(p).__name__} global {str(tuple(p.shape)):9} -> this rank's piece "
          f"{tuple(p.to_local().shape)} ({p.placements[0]!r})")
model(torch.randn(4, 64))
print(f"rank {rank}: inside layer 2's forward its weight is a {inside['type']} of shape {inside['shape']}")
dist.destroy_process_group()

# %% what-each-rank-holds-code
import matplotlib.pyplot as plt
from math import prod
names = list(held[0])
full = [prod(held[0][n]["full"]) for n in names]
fig, ax = plt.subplots(figsize=(9, 2.8))
width = 0.8 / (world_size + 1)
ax.bar([i for i in range(len(names))], full, width, color="0.7", label="full tensor (every DDP rank)")
for r in range(world_size):
    ax.bar([i + (r + 1) * width for i in range(len(names))], [prod(held[r][n]["mine"]) for n in names], width,
           color=f"C{r}", label=f"rank {r}'s shard (FSDP)")
ax.set_xticks([i + width * world_size / 2 for i in range(len(names))], names)
ax.set_ylabel("elements (log scale)"); ax.set_yscale("log"); ax.legend(fontsize=8)
ax.set_title("fully_shard: each parameter is split along dim 0, one piece per rank")
fig.tight_layout(); plt.show()
for r in range(world_size):
    print(f"rank {r} holds {sum(prod(h['mine']) for h in held[r].values()):5} of {sum(full)} parameter elements")

# %% uneven-note [markdown]
# With 2 ranks every dim 0 divides evenly. When it does not (10 output rows on 4 ranks), FSDP2 gives
# ranks `ceil(10/4) = 3` rows each until the rows run out (3, 3, 3, 1) and pads the pieces to one size for
# the collectives; `to_local()` shows the unpadded piece. The split is `torch.chunk`'s (torch 2.13,
# `fsdp/_fully_shard/_fsdp_param.py`, with empty pieces for ranks past the last row):

# %% uneven-code
import torch
uneven = [len(piece) for piece in torch.chunk(torch.arange(10), 4)]
print("10 rows on 4 ranks:", uneven)
assert uneven == [3, 3, 3, 1], uneven

# %% train [markdown]
# ## 2 · Training with FSDP equals training on one device
# First on one device, in the notebook: a `DistributedSampler` with one replica gives the same order of
# samples as the FSDP job's sampler does over all of its ranks, and the global batch is the same (64), so the
# two runs can be compared loss for loss. The loss is cross-entropy over 10 digits: 2.30 is a guess
# (ln 10), and a trained model reaches far below.

# %% train-single
import torch
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits

torch.set_num_threads(1)      # a model this small runs fastest on one thread (and on a busy machine, much)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
train = TensorDataset(*digits("train"))
order = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0)
single_losses = []
for epoch in range(epochs):
    order.set_epoch(epoch)
    total = 0.0
    for xb, yb in DataLoader(train, batch_size=64, sampler=order):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
        total += loss.item() * len(xb)
    single_losses.append(total / len(train))
    print(f"epoch {epoch}: loss {single_losses[-1]:.4f}")

# %% train-fsdp-intro [markdown]
# Then the FSDP job. A training step is written exactly as for one device; `loss.backward()` reduce-scatters
# the gradients (averaged over ranks, like DDP's), and `opt.step()` updates only the rank's shard, so the
# momentum buffers it creates are DTensor shards as well. At the end the job saves a **distributed
# checkpoint** (`torch.distributed.checkpoint`, DCP): `get_state_dict` gives the model's and the optimizer's
# state as DTensors, and `dcp.save` has every rank write its own shard, in parallel, plus one metadata file
# that says which piece of which tensor is where. No rank ever assembles the full model, which is the point
# for a model that does not fit one device.

# %% train-fsdp
# %%ddp -n $world_size --timeout 90 --pull losses@0,accuracy@0,momentum_shape -- --epochs $epochs --out $out_dir
import argparse, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--out", default="runs")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # made after fully_shard: it holds the shards

train = TensorDataset(*digits("train"))
sampler = DistributedSampler(train, shuffle=True, seed=0)
losses = []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    stats = torch.zeros(2)
    for xb, yb in DataLoader(train, batch_size=64 // world, sampler=sampler):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()                  # all-gather per layer, then reduce-scatter its gradients
        opt.step()                       # this rank's shard only
        stats += torch.tensor([loss.item() * len(xb), len(xb)])
    dist.all_reduce(stats)
    losses.append((stats[0] / stats[1]).item())
    if rank == 0:
        print(f"epoch {epoch}: loss {losses[-1]:.4f}")

with torch.no_grad():                    # every rank evaluates the held-out digits with the sharded model
    X, y = digits("test")
    accuracy = (model(X).argmax(1) == y).float().mean().item()
momentum_shape = tuple(opt.state[model[0].weight]["momentum_buffer"].to_local().shape)
print(f"rank {rank}: test accuracy {accuracy:.3f}; my momentum for layer 0's weight: {momentum_shape}")

model_state, optim_state = get_state_dict(model, opt)
dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=f"{args.out}/dcp")
dist.destroy_process_group()

# %% dcp [markdown]
# ## 3 · The distributed checkpoint: one file per rank, loadable at any world size
# `dcp.save` wrote a folder: `__0_0.distcp` from rank 0, `__1_0.distcp` from rank 1, and `.metadata`. Because
# the metadata maps every piece to its place in the global tensor, DCP can load the checkpoint into a
# **different** layout: into FSDP on 4 ranks, or into a plain model in one process. For the latter
# `dcp_to_torch_save` assembles a `torch.save` file (here, in the notebook, with no process group at all),
# and the plain model it loads into classifies the held-out digits exactly as the sharded one did.

# %% dcp-code
import os
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
ckpt_files = sorted(os.listdir(f"{out_dir}/dcp"))
print("files:", ckpt_files)
dcp_to_torch_save(f"{out_dir}/dcp", f"{out_dir}/full.pt")
full_state = torch.load(f"{out_dir}/full.pt")
print({k: tuple(v.shape) for k, v in full_state["model"].items()})
plain = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
plain.load_state_dict(full_state["model"])              # FSDP2 keeps the plain names: no `module.` prefix
X_test, y_test = digits("test")
with torch.no_grad():
    plain_accuracy = (plain(X_test).argmax(1) == y_test).float().mean().item()
print(f"the assembled model: test accuracy {plain_accuracy:.3f} (the sharded one: {accuracy:.3f})")

# %% check [markdown]
# ## Check

# %% check-code
assert _ddp.ok
for r in range(world_size):
    for name, h in held[r].items():
        assert h["type"] == "DTensor" and h["placement"] == "Shard(dim=0)" and h["mesh"] == world_size, h
        assert h["mine"][0] == h["full"][0] // world_size and h["mine"][1:] == h["full"][1:], (name, h)
assert all(i == {"type": "Parameter", "shape": (10, 96)} for i in inside), inside  # gathered in forward
assert len(losses) == epochs and single_losses[0] > losses[-1], losses
assert max(abs(a - b) for a, b in zip(losses, single_losses)) < 1e-3, (losses, single_losses)
assert losses[-1] < 0.5 and accuracy > 0.85, (losses, accuracy)                   # it learned the digits
assert all(tuple(m) == (96 // world_size, 64) for m in momentum_shape), momentum_shape  # sharded optimizer state
assert ckpt_files == [".metadata"] + [f"__{r}_0.distcp" for r in range(world_size)], ckpt_files
assert set(full_state) == {"model", "optim"} and abs(plain_accuracy - accuracy) < 1e-6, (plain_accuracy, accuracy)
print(f"ok: every parameter a Shard(0) DTensor of 1/{world_size} the rows; FSDP losses",
      [round(l, 4) for l in losses], "= one device's", [round(l, 4) for l in single_losses],
      f"; test accuracy {accuracy:.3f}; one checkpoint file per rank, loaded whole into a plain model")

# %% uninterrupted [markdown]
# ## 4 · What an uninterrupted run does next
# A resume is right when it goes on exactly as if nothing had stopped. The one-device model of section 2 is
# still in the notebook: one more epoch of it (epoch 3) is the loss a correct resume must give. The optimizer
# is part of the state: SGD with `momentum=0.9` keeps a momentum buffer per parameter (in the FSDP job, a
# shard of one), and a resume that loads the model but starts a fresh optimizer takes other steps:

# %% uninterrupted-code
import copy

def one_more_epoch(model, opt):
    order.set_epoch(epochs)
    total = 0.0
    for xb, yb in DataLoader(train, batch_size=64, sampler=order):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
        total += loss.item() * len(xb)
    return total / len(train)

restarted = copy.deepcopy(model)                 # the checkpoint's weights, a fresh optimizer
without_optimizer = one_more_epoch(restarted, torch.optim.SGD(restarted.parameters(), lr=0.1, momentum=0.9))
uninterrupted = one_more_epoch(model, opt)       # the same model and optimizer, going on
print(f"epoch {epochs}: uninterrupted {uninterrupted:.4f}; model restored but a fresh optimizer {without_optimizer:.4f}")
assert abs(without_optimizer - uninterrupted) > 3e-3, (without_optimizer, uninterrupted)  # the momentum matters

# %% exercise [markdown]
# ## Exercise
# Resume from the distributed checkpoint in a new job: build the model, `fully_shard` it as before, make the
# optimizer, then take `get_state_dict(model, opt)` as the templates to load into, `dcp.load` the checkpoint
# into them (each rank reads only the pieces of its own shards), `set_state_dict(model, opt, ...)`, and
# train one more epoch (`sampler.set_epoch(epochs)`). Its loss should be the uninterrupted run's.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your resumed training here, in a cell that starts with
#   %%ddp -n $world_size --timeout 90 --pull resumed@0 -- --epoch $epochs --out $out_dir
# where rank 0's `resumed` is the mean loss of the extra epoch (a float).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 90 --pull resumed@0 -- --epoch $epochs --out $out_dir
import argparse, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
parser = argparse.ArgumentParser(); parser.add_argument("--epoch", type=int); parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model_state, optim_state = get_state_dict(model, opt)              # templates: the shards to fill
dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=f"{args.out}/dcp")
set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state)
train = TensorDataset(*digits("train"))
sampler = DistributedSampler(train, shuffle=True, seed=0); sampler.set_epoch(args.epoch)
stats = torch.zeros(2)
for xb, yb in DataLoader(train, batch_size=64 // dist.get_world_size(), sampler=sampler):
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
    stats += torch.tensor([loss.item() * len(xb), len(xb)])
dist.all_reduce(stats)
resumed = (stats[0] / stats[1]).item()
if dist.get_rank() == 0:
    print(f"resumed epoch {args.epoch}: loss {resumed:.4f}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "resumed" in globals(), "✗ nothing to check yet: your cell should end with --pull resumed@0"
assert resumed < losses[-1], f"✗ the resumed epoch's loss {resumed:.4f} is not below the last one before the checkpoint ({losses[-1]:.4f}): did dcp.load fill the templates, and set_state_dict put them into the model?"
assert abs(resumed - without_optimizer) > 1e-3, f"✗ the resumed epoch's loss {resumed:.4f} is that of a fresh optimizer ({without_optimizer:.4f}), not the uninterrupted run's {uninterrupted:.4f}: load the optimizer's state too (get_state_dict(model, opt), both into dcp.load and set_state_dict)"
assert abs(resumed - uninterrupted) < 1e-3, f"✗ the resumed epoch's loss {resumed:.4f} is not the uninterrupted run's {uninterrupted:.4f}: same model, optimizer, sampler epoch ({epochs}) and global batch (64)?"
print(f"✓ training went on from the distributed checkpoint as if never stopped: loss {losses[-1]:.4f} -> {resumed:.4f} "
      f"(uninterrupted {uninterrupted:.4f}; a fresh optimizer would give {without_optimizer:.4f})")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 90 --pull resumed@0 -- --epoch $epochs --out $out_dir
import argparse, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
parser = argparse.ArgumentParser(); parser.add_argument("--epoch", type=int); parser.add_argument("--out")
args = parser.parse_args()
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model_state = get_model_state_dict(model)                           # the model only: the momentum starts empty
dcp.load({"model": model_state}, checkpoint_id=f"{args.out}/dcp")
set_model_state_dict(model, model_state)
train = TensorDataset(*digits("train"))
sampler = DistributedSampler(train, shuffle=True, seed=0); sampler.set_epoch(args.epoch)
stats = torch.zeros(2)
for xb, yb in DataLoader(train, batch_size=64 // dist.get_world_size(), sampler=sampler):
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
    stats += torch.tensor([loss.item() * len(xb), len(xb)])
dist.all_reduce(stats)
resumed = (stats[0] / stats[1]).item()
dist.destroy_process_group()
# expect: ✗ .*fresh optimizer
