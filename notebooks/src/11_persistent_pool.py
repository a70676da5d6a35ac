# %% title [markdown]
# # 11 · Persistent workers: training across cells (常驻进程池)
#
# A fresh `%%ddp` cell is one `torchrun` job: processes start, run, and end. For training in a notebook you often want the model, the optimizer and the process group to **stay alive between cells**, like ipyparallel's engines. `%ddp_pool start -n N` starts such workers once; every `%%ddp` cell then runs on them, with the same torchrun environment, per-rank output and diagnostics. `--push` sends notebook values in, `--pull` brings worker values back (a list indexed by rank, or `name@0` for one rank), `--ranks 0` runs a cell on some ranks only, `--fresh` still runs a separate job. A collective that hangs costs one cell, not the model (section 4), and `--all-cells` sends every cell to the pool without a magic line (section 5).

# %% parameters tags=["parameters"]
world_size = 2
epochs = 3

# %% title-code
# %load_ext nbddp
# %ddp_pool start -n $world_size --timeout 60

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

# %% hang-costs-one-cell [markdown]
# ## 4 · A collective that hangs costs one cell, not the model
# The classic mistake of lesson 06, now on the pool: a collective inside `if rank == 0:`. Rank 0 waits in
# `all_reduce` for a partner that never comes, in C code that the stop button's SIGINT cannot reach, and
# `ProcessGroup.abort()` does not wake it either. At the cell's `--timeout` nbddp shows where each rank is, then
# closes the process group's connections: rank 0's call returns, raising `nbddp.Released` at that line. The
# workers stay, with everything the cells above built; only the group is gone.

# %% hang-costs-one-cell-code
import nbddp
hang = '''
t = torch.ones(1)
if rank == 0:
    dist.all_reduce(t)          # rank 1 never calls it
'''
try:
    get_ipython().run_cell_magic("ddp", "--timeout 5", hang)
    raise AssertionError("expected a timeout")
except nbddp.DDPTimeout as exc:
    hung = exc.result
for r in hung.ranks:
    print(f"rank {r.rank}: {r.state} ({r.cause or 'its cell ended'})")

# %% hang-costs-one-cell-check
assert hung.timed_out and hung.ranks[0].cause.startswith("released from a blocked collective"), hung.ranks[0]
assert all(r.state == "ok" for r in hung.ranks[1:]), hung.ranks

# %% group-again [markdown]
# The next cell on the pool says once that the group is gone. Create it again, and wrap the model in DDP again:
# a DDP model belongs to the process group it was made with. The weights are the ones the epochs above trained.

# %% group-again-ddp
# %%ddp --pull kept --timeout 60
print(f'rank {rank}: {len(history)} losses of history kept; process group alive: {dist.is_initialized()}')
dist.init_process_group('gloo')
model = DDP(model.module)                  # the same module and weights, on the new group
kept = model.module[0].weight.sum().item()

# %% group-again-code
print('first-layer weight sum per rank, after the hang:', kept)
assert kept == weights, (kept, weights)    # section 3's weights, unchanged on every rank

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

# %% all-cells [markdown]
# ## 5 · Every cell on the pool (`--all-cells`)
# When most cells of a notebook run on the pool, a `%%ddp` line on each is noise. `%ddp_pool all-cells on` (or
# `--all-cells` when the pool starts), like ipyparallel's `%autopx`, sends every cell of code to the pool with the
# pool's options (here its `--timeout 60`), until `%ddp_pool all-cells off`. A cell that begins with `%%local` runs
# in the notebook's kernel, and so does one that begins with another magic, such as the two that turn it on and off.

# %% all-cells-on
# %ddp_pool all-cells on

# %% all-cells-on-the-pool
print(f'rank {rank}: {len(history)} losses so far, on the pool without a magic line')

# %% all-cells-local
# %%local
import os
print('this cell ran in the notebook kernel:', 'RANK' not in os.environ)
assert 'RANK' not in os.environ and _ddp.ok and len(_ddp.ranks) == world_size, _ddp

# %% all-cells-off
# %ddp_pool all-cells off

# %% stop-pool
# %ddp_pool stop
