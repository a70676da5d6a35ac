# %% title [markdown]
# # 04 · From a single-device script to DDP (从单卡到 DistributedDataParallel)
#
# First a plain training script on one device. Then the same script made distributed, step by step:
# 1. read `LOCAL_RANK` from the environment (argparse default), not from a launcher argument;
# 2. `torch.cuda.set_device(local_rank)` — **only with a GPU per rank**, and **first**, before anything touches CUDA or
#    the process group. Not because `init_process_group` puts NCCL on the current device: without `device_id=`
#    it is lazy, and NCCL builds its communicator at the first collective, on that tensor's device. What does
#    use the *current* device — `cuda:0` on a rank that has not bound yet — is `dist.barrier()` in a group
#    not bound to a device (torch 2.13 warns "barrier(): using the device under current context"), the object
#    collectives (`all_gather_object`, `broadcast_object_list`, … move the pickled object to
#    `torch.cuda.current_device()`), and any `.cuda()` or `device="cuda"` without an index. Each such call
#    on an unbound rank makes a CUDA context (memory) on GPU 0. The articles call `set_device` after
#    `init_process_group`: fine while nothing in between touches CUDA, but one barrier or `.cuda()` there and
#    every rank holds memory on GPU 0; binding first leaves no such gap. `init_process_group(..., device_id=torch.device("cuda", local_rank))`
#    (torch ≥ 2.3) binds the group too: barrier uses that device, and NCCL connects at once, so a broken
#    setup fails in `init_process_group`, not at the first collective. *A GPU per rank*: with fewer GPUs on
#    the machine than ranks on it (`LOCAL_WORLD_SIZE`), `set_device` past the last GPU fails ("invalid
#    device ordinal") and NCCL refuses two ranks on one GPU, so the script below trains on CPU with gloo
#    then, as `%%ddp`'s default `--backend auto` does;
# 3. `dist.init_process_group(backend, init_method="env://")` — rank, world size and meeting point come from
#    the variables the launcher set;
# 4. wrap the model: `DDP(model, device_ids=[local_rank])` (no `device_ids` on CPU); DDP copies rank 0's
#    weights to every rank here, and averages gradients over ranks during `backward()`;
# 5. `DistributedSampler` gives each rank its own part of the data; `sampler.set_epoch(epoch)` reshuffles;
# 6. save the checkpoint — model **and optimizer** — **on rank 0 only**, then `dist.barrier()` so nobody
#    reads it before it exists;
# 7. `dist.destroy_process_group()` at the end.

# %% parameters tags=["parameters"]
world_size = 2
epochs = 2
out_dir = "runs/04"

# %% load-ext
# %load_ext nbddp

# %% single-device-version-runs [markdown]
# ## 1 · The single-device version (runs in the notebook itself)
# The data are real: `nbddp.datasets.digits()`, 1,797 handwritten digits of 8×8 pixels (UCI, shipped with
# nbddp), 1,500 to train on and 297 held out. The model reads the 64 pixels and scores the 10 digits
# (`Linear(64, 10)`, softmax regression); the loss is cross-entropy, where 2.303 (= ln 10) is a guess and
# 0 is certainty, and the held-out accuracy says how many digits it reads right.
# Its sampler is `DistributedSampler` with one replica: the same shuffle the DDP version's sampler makes, so
# the two runs below see the same samples in the same order and their losses can be compared number for
# number. (With `shuffle=True` in a `DataLoader` the orders differ, and so do the losses, a little.)

# %% single-device-version-runs-code
import torch
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits

def make_data():                         # 1,500 handwritten digits, 8x8 pixels -> the digit 0..9
    return TensorDataset(*digits("train"))

torch.set_num_threads(1)      # a model this small runs fastest on one thread (and on a busy machine, much)
torch.manual_seed(0)
model = torch.nn.Linear(64, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data = make_data()
order = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)   # one replica: all of it
loader = DataLoader(data, batch_size=32, sampler=order)
single_losses = []
for epoch in range(epochs):
    order.set_epoch(epoch)
    total, count = 0.0, 0
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
        total += loss.item() * len(xb); count += len(xb)
    single_losses.append(total / count)
    print(f"epoch {epoch}: loss {total / count:.4f}")
X_test, y_test = digits("test")
with torch.no_grad():
    single_accuracy = (model(X_test).argmax(1) == y_test).float().mean().item()
print(f"held-out accuracy {single_accuracy:.3f} (a guess: 0.1)")

# %% ddp-version-run-as [markdown]
# ## 2 · The DDP version, run as a script with arguments
# The cell is a complete training script, the one you would start with
# `torchrun --nproc_per_node=2 runs/04/train_ddp.py --epochs 2 --out runs/04`: its arguments arrive in `sys.argv`, and
# the numbered comments are the steps above. The cell below writes it to `runs/04/train_ddp.py` for torchrun. (The
# cell's first line passes the same arguments after `--`, and brings a few values back for the check.)

# %% ddp-version-run-as-ddp
# %%ddp -n $world_size --timeout 60 --pull losses@0,accuracy@0,before_wrap,after_wrap,keys -- --epochs $epochs --out $out_dir
import argparse, os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits

def make_data():                         # 1,500 handwritten digits, 8x8 pixels -> the digit 0..9
    return TensorDataset(*digits("train"))

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--out", default="runs")
parser.add_argument("--local-rank", "--local_rank", type=int,                  # (1)
                    default=int(os.environ.get("LOCAL_RANK", 0)))
args = parser.parse_args()

local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))                       # ranks on this machine
use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks   # a GPU per rank, or CPU
if use_cuda:                                                                    # (2) GPU only, first
    torch.cuda.set_device(args.local_rank)
device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")
dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")   # (3)
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(rank)                  # different on purpose: DDP(...) copies rank 0's weights to all
model = torch.nn.Linear(64, 10).to(device)
before_wrap = model.weight.sum().item()
model = DDP(model, device_ids=[args.local_rank] if use_cuda else None)         # (4)
after_wrap = model.module.weight.sum().item()
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

data = make_data()
sampler = DistributedSampler(data, shuffle=True, seed=0)                        # (5)
loader = DataLoader(data, batch_size=32 // world, sampler=sampler)             # same global batch
losses = []
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)                     # a different shuffle every epoch
    stats = torch.zeros(2, device=device)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()                          # DDP all-reduces the gradients here
        opt.step()
        stats += torch.tensor([loss.item() * len(xb), len(xb)], device=device)
    dist.all_reduce(stats)                       # loss over all ranks' samples
    losses.append((stats[0] / stats[1]).item())
    if rank == 0:
        print(f"epoch {epoch}: loss {losses[-1]:.4f} ({int(stats[1])} samples)")

X_test, y_test = digits("test")
with torch.no_grad():                            # every rank holds the same weights: any can evaluate
    accuracy = (model(X_test.to(device)).argmax(1) == y_test.to(device)).float().mean().item()
if rank == 0:
    print(f"held-out accuracy {accuracy:.3f}")
keys = {"model.state_dict()": list(model.state_dict()), "model.module.state_dict()": list(model.module.state_dict())}
if rank == 0:                                                                   # (6)
    os.makedirs(args.out, exist_ok=True)
    torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epochs": args.epochs},
               f"{args.out}/ckpt.pt")
dist.barrier()                                   # rank 0 has written it before anyone goes on
ckpt = torch.load(f"{args.out}/ckpt.pt", map_location=device)
print(f"rank {rank}: loaded checkpoint of epoch {ckpt['epochs']}, weight sum "
      f"{model.module.weight.sum().item():.6f}")
dist.destroy_process_group()                                                    # (7)

# %% ddp-version-run-as-code
# %ddp_export $out_dir/train_ddp.py

# %% ddp-version-run-as-note [markdown]
# **`model.module`.** DDP wraps your model: its `state_dict()` names every tensor `module.…`
# (`keys` above). Save `model.module.state_dict()` so the file loads into a plain model — on one GPU, for
# inference, or before the next `DDP(...)`; a `module.`-prefixed file does not:

# %% ddp-version-run-as-code-2
print(keys[0])
plain = torch.nn.Linear(64, 10)
try:
    plain.load_state_dict({"module.weight": plain.weight.data, "module.bias": plain.bias.data})
    raise AssertionError("expected a key mismatch")
except RuntimeError as exc:
    prefix_error = str(exc).splitlines()[0] + " " + str(exc).splitlines()[1].strip()
print(prefix_error)

# %% which-gpu-each-rank [markdown]
# ## 3 · Which GPU each rank gets
# With GPUs, rank *r* of a node uses `cuda:LOCAL_RANK`, so a node can run at most as many ranks as it has
# GPUs (`nproc_per_node ≤ GPUs`): NCCL refuses two ranks on one GPU ("Duplicate GPU detected") and
# `set_device` past the last GPU is `invalid device ordinal`. Schedulers choose GPUs with
# `CUDA_VISIBLE_DEVICES`: a rank sees only those, renumbered from 0, so `cuda:LOCAL_RANK` still works.
# `%%ddp --gpus 1,3` does the same. nbddp's placement rules are plain functions of the GPU count, so they
# can be shown on this CPU machine for an imagined node with 4 GPUs:

# %% which-gpu-each-rank-code
from nbddp import DDPUsageError
from nbddp.core.launchrules import make_spec
from nbddp.core.placement import plan
for line, gpus in (("-n 4", None), ("-n 2 --gpus 1,3", (1, 3))):
    p = plan(make_spec(n=4 if gpus is None else 2, gpus=gpus), device_count=4)
    seen = dict(p.env).get("CUDA_VISIBLE_DEVICES", "all 4")
    for local in range(len(p.devices)):
        print(f"%%ddp {line:16} local rank {local}: CUDA_VISIBLE_DEVICES={seen:6} -> {p.device_of(local)} "
              f"= physical GPU {p.physical[local]}, backend {p.backend}")
print("-n 8 --backend auto on 4 GPUs:", plan(make_spec(n=8), device_count=4).note)
try:
    plan(make_spec(n=8, backend="nccl"), device_count=4)
except DDPUsageError as exc:   # a ValueError; %%ddp shows it as a UsageError
    too_many = str(exc)
print("-n 8 --backend nccl on 4 GPUs:", too_many)

# %% on-a-gpu [markdown]
# ### On a GPU: one rank, bound to its device
# This cell needs CUDA; without it, it says so and does nothing (its run on a GPU machine is
# `docs/lessons/gpu/04_single_device_to_ddp.ipynb`, listed on the docs page *GPU runs*). One rank on one GPU
# shows steps 2–4 for real: `set_device` first, `init_process_group("nccl", device_id=...)` bound to the
# rank's device (NCCL connects inside the call), the model's memory on `cuda:LOCAL_RANK`
# (`torch.cuda.memory_allocated` counts the bytes of this process's tensors on a device: at least the
# parameters' 2,600), and DDP with `device_ids=[local_rank]`, its gradients on the same device.
#
# What one GPU cannot show: ranks on **different** GPUs. Section 2's script on a machine with a GPU per
# rank (`-n` up to `torch.cuda.device_count()`) takes its `use_cuda` branch: rank *r* binds `cuda:r`, its
# tensors are counted by `torch.cuda.memory_allocated(r)`, and NCCL all-reduces the gradients between the
# GPUs. On a machine with one GPU, section 2's `-n 2` cell trains on CPU with gloo, as without a GPU.

# %% on-a-gpu-ddp
# %%ddp -n 1 --timeout 60 --pull gpu_run@0
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
gpu_run = None
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here (its run on a GPU: docs/lessons/gpu/04_single_device_to_ddp.ipynb)")
else:
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)                                # (2) first: the current device is ours
    dist.init_process_group("nccl", device_id=device)            # (3) bound to it: NCCL connects now
    before = torch.cuda.memory_allocated(device)
    model = torch.nn.Linear(64, 10).to(device)
    on_device = torch.cuda.memory_allocated(device) - before     # the model's bytes on our GPU
    model = DDP(model, device_ids=[local_rank])                  # (4)
    model(torch.randn(32, 64, device=device)).sum().backward()   # the all-reduce runs on the GPU (NCCL)
    gpu_run = {"GPU": torch.cuda.get_device_name(device), "current device": torch.cuda.current_device(),
               "group bound to": str(dist.group.WORLD.bound_device_id), "backend": dist.get_backend(),
               "parameters on": str(next(model.parameters()).device), "gradients on": str(model.module.weight.grad.device),
               "parameter bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
               "memory_allocated for the model": on_device}
    print(gpu_run)
    dist.destroy_process_group()

# %% on-a-gpu-code
if gpu_run is None:
    print("no GPU here: the cell above was skipped")
else:
    assert gpu_run["current device"] == 0 and gpu_run["backend"] == "nccl", gpu_run
    assert gpu_run["group bound to"] == gpu_run["parameters on"] == gpu_run["gradients on"] == "cuda:0", gpu_run
    assert gpu_run["memory_allocated for the model"] >= gpu_run["parameter bytes"] == (64 * 10 + 10) * 4, gpu_run
    print(f"one rank on {gpu_run['GPU']}: bound to cuda:0, the model's {gpu_run['memory_allocated for the model']:,} "
          "bytes allocated there, DDP's gradients there too")

# %% check [markdown]
# ## Check

# %% check-code
import os
assert _ddp.ok
assert len(losses) == epochs and losses[-1] < losses[0], losses
assert max(abs(a - b) for a, b in zip(losses, single_losses)) < 1e-3, (losses, single_losses)  # same numbers
if world_size > 1:
    assert len(set(before_wrap)) == world_size, before_wrap          # each rank made different weights ...
assert set(after_wrap) == {before_wrap[0]}, after_wrap               # ... and DDP gave all of them rank 0's
assert keys[0]["model.state_dict()"] == ["module.weight", "module.bias"] and "Missing key" in prefix_error
ckpt = torch.load(f"{out_dir}/ckpt.pt", map_location="cpu")   # (GPU tensors after a run on GPUs)
assert ckpt["optimizer"]["state"][0]["momentum_buffer"].shape == (10, 64)   # momentum saved with the model
assert abs(accuracy - single_accuracy) < 0.01 and accuracy > 0.8, (accuracy, single_accuracy)  # it reads digits
assert os.path.exists(f"{out_dir}/train_ddp.py")
assert "nccl needs one GPU per rank" in too_many
print("ok: DDP losses", [round(l, 4) for l in losses], "= single device", [round(l, 4) for l in single_losses],
      f"(same samples, same order, same global batch of 32); held-out accuracy {accuracy:.3f}")

# %% uninterrupted [markdown]
# ## 4 · What an uninterrupted run does next
# A resumed job is right when it continues exactly as if nothing had stopped. The single-device model above
# is still here: one more epoch of it (epoch 2) is the loss a correct resume must give. The optimizer is part
# of the state: SGD with `momentum=0.9` carries a momentum buffer per parameter, and a resume that reloads
# the model but starts a fresh optimizer (empty buffers) takes smaller steps at first and ends the epoch
# elsewhere. Both, from the same weights:

# %% uninterrupted-code
import copy

def one_more_epoch(model, opt):
    order.set_epoch(epochs)
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
        total += loss.item() * len(xb)
    return total / len(data)

restarted = copy.deepcopy(model)                 # the weights of the checkpoint, a fresh optimizer
without_optimizer = one_more_epoch(restarted, torch.optim.SGD(restarted.parameters(), lr=0.1, momentum=0.9))
uninterrupted = one_more_epoch(model, opt)       # the same model and optimizer, going on
print(f"epoch {epochs}: uninterrupted {uninterrupted:.4f}; model restored but a fresh optimizer {without_optimizer:.4f}")
assert abs(without_optimizer - uninterrupted) > 3e-3, (without_optimizer, uninterrupted)  # the momentum matters

# %% exercise [markdown]
# ## Exercise
# Resume training: start a second job that loads `ckpt.pt` on every rank **before** wrapping with DDP, and
# restores the optimizer too (its momentum is part of the training state: without it the next steps differ
# from an uninterrupted run), trains one more epoch (`sampler.set_epoch(ckpt["epochs"])`, the same batches
# as above), and prints the loss. It should equal the uninterrupted run's.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your resumed training here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull resumed@0 -- --out $out_dir
# where rank 0's `resumed` is the mean loss of the extra epoch (a float).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull resumed@0 -- --out $out_dir
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
args = argparse.ArgumentParser(); args.add_argument("--out"); args = args.parse_args()
dist.init_process_group("gloo")
data = TensorDataset(*digits("train"))
model = torch.nn.Linear(64, 10)
ckpt = torch.load(f"{args.out}/ckpt.pt", map_location="cpu")   # saved from cuda:0 after a run on GPUs
model.load_state_dict(ckpt["model"])
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
opt.load_state_dict(ckpt["optimizer"])               # momentum buffers, as they were
sampler = DistributedSampler(data, seed=0); sampler.set_epoch(ckpt["epochs"])
stats = torch.zeros(2)
for xb, yb in DataLoader(data, batch_size=32 // dist.get_world_size(), sampler=sampler):
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
    stats += torch.tensor([loss.item() * len(xb), len(xb)])
dist.all_reduce(stats)
resumed = (stats[0] / stats[1]).item()
if dist.get_rank() == 0:
    print(f"resumed epoch {ckpt['epochs']}: loss {resumed:.4f}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "resumed" in globals(), "✗ nothing to check yet: your cell should end with --pull resumed@0"
assert abs(resumed - without_optimizer) > 1e-3, f"✗ the resumed epoch's loss {resumed:.4f} is that of a fresh optimizer ({without_optimizer:.4f}), not the uninterrupted run's {uninterrupted:.4f}: restore the momentum too, opt.load_state_dict(ckpt['optimizer'])"
assert resumed < losses[-1], f"✗ the resumed epoch's loss {resumed:.4f} is not below the last one before the checkpoint ({losses[-1]:.4f}): did every rank load the model, before DDP(...)?"
assert abs(resumed - uninterrupted) < 1e-3, f"✗ the resumed epoch's loss {resumed:.4f} is not the uninterrupted run's {uninterrupted:.4f}: same model, optimizer, sampler epoch ({epochs}) and global batch (32)?"
print(f"✓ training went on from the checkpoint as if never stopped: loss {losses[-1]:.4f} -> {resumed:.4f} "
      f"(uninterrupted {uninterrupted:.4f}; a fresh optimizer would give {without_optimizer:.4f})")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull resumed@0 -- --out $out_dir
import argparse, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
from nbddp.datasets import digits
args = argparse.ArgumentParser(); args.add_argument("--out"); args = args.parse_args()
dist.init_process_group("gloo")
data = TensorDataset(*digits("train"))
model = torch.nn.Linear(64, 10)
ckpt = torch.load(f"{args.out}/ckpt.pt", map_location="cpu")   # saved from cuda:0 after a run on GPUs
model.load_state_dict(ckpt["model"])
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # the optimizer's state is not loaded
sampler = DistributedSampler(data, seed=0); sampler.set_epoch(ckpt["epochs"])
stats = torch.zeros(2)
for xb, yb in DataLoader(data, batch_size=32 // dist.get_world_size(), sampler=sampler):
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()
    stats += torch.tensor([loss.item() * len(xb), len(xb)])
dist.all_reduce(stats)
resumed = (stats[0] / stats[1]).item()
dist.destroy_process_group()
# expect: ✗ .*fresh optimizer
