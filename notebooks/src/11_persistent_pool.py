# %% title [markdown]
# # 11 · Persistent workers: training across cells (常驻进程池)
#
# A fresh `%%ddp` cell is one `torchrun` job: processes start, run, and end. For training in a notebook you often want the model, the optimizer and the process group to **stay alive between cells**, like ipyparallel's engines. `%ddp_pool start -n N` starts such workers once; every `%%ddp` cell then runs on them, with the same torchrun environment, per-rank output and diagnostics. `--push` sends notebook values in, `--pull` brings worker values back (a list indexed by rank, or `name@0` for one rank), `--ranks 0` runs a cell on some ranks only, `--fresh` still runs a separate job.

# %% parameters tags=["parameters"]
world_size = 2
epochs = 3

# %% title-code
# %load_ext nbddp
# %ddp_pool start -n $world_size

# %% define-model-once [markdown]
# ## 1 · Define the model once
# The process group and the DDP model live in the workers' `__main__` from now on.

# %% define-model-once-ddp
# %%ddp --timeout 60
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X = torch.randn(256, 4, generator=g); y = X.sum(dim=1, keepdim=True)
shard = slice(rank, None, world)          # each rank trains on its own part of the data
history = []
print(f'rank {rank}: {X[shard].shape[0]} samples')

# %% train-few-epochs [markdown]
# ## 2 · Train a few epochs
# Push the number of epochs from the notebook; each epoch's last mini-batch loss is averaged over the ranks
# with `all_reduce`.

# %% train-few-epochs-ddp
# %%ddp --push epochs --timeout 60
for epoch in range(epochs):
    for i in range(0, X[shard].shape[0], 32):
        xb, yb = X[shard][i:i + 32], y[shard][i:i + 32]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
    t = loss.detach().clone(); dist.all_reduce(t); t /= world
    history.append(t.item())
    if rank == 0:
        print(f'epoch {epoch}: loss {t.item():.4f}')

# %% evaluate-another-cell-pull [markdown]
# ## 3 · Evaluate in another cell, and pull the loss history back

# %% evaluate-another-cell-pull-ddp
# %%ddp --pull history@0,weights --timeout 60
with torch.no_grad():
    mse = torch.nn.functional.mse_loss(model(X), y)
weights = model.module[0].weight.sum().item()
print(f'rank {rank}: eval mse {mse.item():.4f}')

# %% evaluate-another-cell-pull-code
history_above = list(history)            # rank 0's history as this section pulled it
print('loss history (rank 0):', [round(v, 4) for v in history])
print('first-layer weight sum per rank:', weights)

# %% check [markdown]
# ## Check
# DDP keeps the replicas identical, so every rank holds the same weights; and training lowered the loss.

# %% check-code
assert len(history) == epochs and history[-1] < history[0], history
assert len(weights) == world_size and max(weights) - min(weights) < 1e-5, weights
print('ok: loss', round(history[0], 3), '->', round(history[-1], 3))

# %% exercise [markdown]
# ## Exercise
# Run one more epoch in a new cell, on the pool, as section 2 trains, and pull rank 0's `history` back: it
# should go on from the losses above, with a lower one.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your extra epoch here, in a cell that starts with
#   %%ddp --pull history@0 --timeout 60
# (no --fresh: it runs on the pool, where model, opt, X, y, shard and history still are).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp --pull history@0 --timeout 60
for i in range(0, X[shard].shape[0], 32):         # model, opt, X, y, shard, history: still on the workers
    xb, yb = X[shard][i:i + 32], y[shard][i:i + 32]
    opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(xb), yb); loss.backward(); opt.step()
t = loss.detach().clone(); dist.all_reduce(t); t /= world
history.append(t.item())

# %% check-answer tags=["check"]
assert history != history_above, f"✗ nothing to check yet: rank 0's history is still section 3's {len(history_above)} losses: run one more epoch on the pool and --pull history@0"
assert not (history and isinstance(history[0], list)), "✗ `history` is one list per rank (--pull history): pull rank 0's alone with --pull history@0"
assert history[:len(history_above)] == history_above, f"✗ rank 0's history {[round(v, 4) for v in history]} does not go on from section 3's {[round(v, 4) for v in history_above]}: the cell started over (a separate job with --fresh, or a new model and history); on the pool, model, opt and history are still there: just train"
assert len(history) > len(history_above) and history[-1] < history_above[-1], f"✗ rank 0's history {[round(v, 4) for v in history]}: the new epoch's loss should be below the last one above ({history_above[-1]:.4f}), as training goes on"
print(f"✓ the pool kept the model: rank 0's history went on, {[round(v, 4) for v in history_above]} + {[round(v, 4) for v in history[len(history_above):]]}")

# %% mistake-fresh-job tags=["mistake"]
# %%ddp --fresh -n $world_size --pull history@0 --timeout 60
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group('gloo')                   # a separate job: nothing of the pool's is here
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
X = torch.randn(256, 4, generator=g); y = X.sum(dim=1, keepdim=True)
shard = slice(rank, None, world)
history = []
for i in range(0, X[shard].shape[0], 32):
    xb, yb = X[shard][i:i + 32], y[shard][i:i + 32]
    opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(xb), yb); loss.backward(); opt.step()
t = loss.detach().clone(); dist.all_reduce(t); t /= world
history.append(t.item())
dist.destroy_process_group()
# expect: ✗ .*started over

# %% stop-pool
# %ddp_pool stop
