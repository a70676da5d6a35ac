# %% title [markdown]
# # 03 · Point-to-point and collective communication (点对点通信与集合通信)
#
# **Point-to-point**: one rank sends, one named rank receives (`send`/`recv`, non-blocking `isend`/`irecv`).
# **Collectives** (集合通信): *every* rank of the group calls the same function, and data moves among all:
#
# | call | before → after |
# |---|---|
# | `broadcast(t, src)` | `src`'s tensor is copied to every rank |
# | `reduce(t, dst, op)` | `dst` gets the sum (or max, …) of all ranks' tensors; on the other ranks `t` is undefined afterwards |
# | `all_reduce(t, op)` | **every** rank gets the sum — what DDP does with gradients |
# | `gather(t, list, dst)` | `dst` gets a list with every rank's tensor |
# | `all_gather(list, t)` | every rank gets that list |
# | `scatter(t, list, src)` | `src` hands piece *i* of its list to rank *i* |
# | `reduce_scatter(t, list, op)` | rank *i* gets the sum of piece *i* of every rank's list — the first half of a ring all-reduce, and how FSDP reduces gradients (lesson 14) |
# | `barrier()` | nobody continues until everybody has arrived |

# %% parameters tags=["parameters"]
world_size = 4        # a ring needs more than 2 ranks to show anything: with 2, "left" and "right" are the same rank

# %% load-ext
# %load_ext nbddp

# %% send-recv-pass-token [markdown]
# ## 1 · send / recv: pass a token around the ring 0 → 1 → … → 0

# %% send-recv-pass-token-ddp
# %%ddp -n $world_size --timeout 60 --pull token
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
token = torch.zeros(1)
if world > 1:
    if rank == 0:
        token += 1
        dist.send(token, dst=1)
        dist.recv(token, src=world - 1)
    else:
        dist.recv(token, src=rank - 1)
        token += 1
        dist.send(token, dst=(rank + 1) % world)
print(f"rank {rank}: token = {token.item():.0f}")
dist.destroy_process_group()

# %% send-recv-pass-token-code
assert token[0].item() == (world_size if world_size > 1 else 0), token      # --pull token: one per rank

# %% all-collectives-each-rank [markdown]
# ## 2 · All the collectives, each rank starting from `rank + 1`

# %% all-collectives-each-rank-ddp
# %%ddp -n $world_size --timeout 60 --pull got
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
got = {}
def show(name, value):
    got[name] = value
    print(f"{name:11} rank {rank}: {value}")

t = torch.tensor([rank + 1.0]); dist.broadcast(t, src=0);              show("broadcast", t.tolist())
t = torch.tensor([rank + 1.0]); dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
if rank == 0:                         # only dst's tensor is defined; elsewhere it holds scratch values
    show("reduce", t.tolist())
t = torch.tensor([rank + 1.0]); dist.all_reduce(t, op=dist.ReduceOp.SUM);    show("all_reduce", t.tolist())
t = torch.tensor([rank + 1.0]); m = t.clone(); dist.all_reduce(m, op=dist.ReduceOp.MAX); show("all_reduce max", m.tolist())
bucket = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
dist.gather(torch.tensor([rank + 1.0]), gather_list=bucket, dst=0);     show("gather", bucket and [b.item() for b in bucket])
everyone = [torch.zeros(1) for _ in range(world)]
dist.all_gather(everyone, torch.tensor([rank + 1.0]));                  show("all_gather", [e.item() for e in everyone])
piece = torch.zeros(1)
dist.scatter(piece, scatter_list=[torch.tensor([10.0 * (i + 1)]) for i in range(world)] if rank == 0 else None, src=0)
show("scatter", piece.tolist())
dist.barrier();                                                          show("barrier", "everyone got here")
dist.destroy_process_group()

# %% all-collectives-each-rank-code
total = world_size * (world_size + 1) / 2      # `--pull got`: each rank's results, indexed by rank
assert got[0]["reduce"] == [total] and all("reduce" not in g for g in got[1:])
assert all(g["all_reduce"] == [total] and g["broadcast"] == [1.0] for g in got)
assert all(g["all_gather"] == [float(i + 1) for i in range(world_size)] for g in got)
assert [g["scatter"] for g in got] == [[10.0 * (i + 1)] for i in range(world_size)]   # none is the zeros it started with
print("collectives behave as the table says")

# %% pictures [markdown]
# ## 3 · The collectives in pictures
# Each rank starts with a vector of `world_size` numbers in its own color: rank 0 holds 1 2 …, rank 1 holds
# 10 20 …, rank 2 100 200 … (so any sum of them says where it came from). Every collective runs on a fresh
# copy, the ranks send back what they hold afterwards, and the figure draws before and after from those
# values: a cell in a rank's color was copied from that rank, a gray one is a sum over ranks. After `reduce`
# only the destination's tensor is defined (the others are drawn hatched: gloo leaves scratch values there).

# %% pictures-ddp
# %%ddp -n $world_size --timeout 60 --pull after
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mine = lambda: torch.tensor([(i + 1) * 10.0 ** rank for i in range(world)])
after = {}
t = mine(); dist.broadcast(t, src=0);                   after["broadcast(src=0)"] = t.tolist()
t = mine(); dist.reduce(t, dst=0);                      after["reduce(dst=0)"] = t.tolist() if rank == 0 else None
t = mine(); dist.all_reduce(t);                         after["all_reduce"] = t.tolist()
parts = [torch.zeros(world) for _ in range(world)]; dist.all_gather(parts, mine())
after["all_gather"] = torch.cat(parts).tolist()
piece = torch.zeros(1); dist.reduce_scatter(piece, list(mine().split(1)))
after["reduce_scatter"] = piece.tolist()
print(f"rank {rank}: before {mine().tolist()}, reduce_scatter -> {piece.tolist()}")
dist.destroy_process_group()

# %% pictures-code
import matplotlib.pyplot as plt
before = [[(i + 1) * 10.0 ** r for i in range(world_size)] for r in range(world_size)]

def cells(ax, x0, y, values):
    """One rank's tensor as a row of boxes: a rank's color for its own numbers, gray for sums."""
    if values is None:
        ax.add_patch(plt.Rectangle((x0, y), world_size - 0.05, 0.85, fill=False, hatch="///", color="0.6"))
        ax.text(x0 + world_size / 2, y + 0.42, "undefined", ha="center", va="center", fontsize=7, color="0.4")
        return
    for i, v in enumerate(values):
        owner = [r for r in range(world_size) if v in before[r]]
        ax.add_patch(plt.Rectangle((x0 + i, y), 0.95, 0.85, color=f"C{owner[0]}" if owner else "0.7", alpha=0.55))
        ax.text(x0 + i + 0.47, y + 0.42, f"{v:g}", ha="center", va="center", fontsize=8)

names = list(after[0])
fig, axes = plt.subplots(len(names), 1, figsize=(9, len(names) * (0.5 * world_size + 0.55)))
width = max(len(a[name] or []) for a in after for name in names)      # all_gather's: world_size² numbers
for ax, name in zip(axes, names):
    for r in range(world_size):
        y = world_size - 1 - r
        ax.text(-0.3, y + 0.42, f"rank {r}", ha="right", va="center", fontsize=8)
        cells(ax, 0, y, before[r])
        cells(ax, world_size + 2, y, after[r][name])
    ax.annotate("", (world_size + 1.7, world_size / 2), (world_size + 0.2, world_size / 2),
                arrowprops=dict(arrowstyle="->"))
    ax.set_title(name, loc="left", fontsize=9, fontfamily="monospace")
    ax.set_xlim(-1.5, world_size + 3 + width); ax.set_ylim(-0.1, world_size); ax.axis("off")
fig.suptitle("before → after, as the ranks reported them", fontsize=10)
fig.tight_layout(); plt.show()

# %% pictures-check
column = [sum(before[r][i] for r in range(world_size)) for i in range(world_size)]   # the sum of piece i
assert all(a["broadcast(src=0)"] == before[0] and a["all_reduce"] == column for a in after)
assert after[0]["reduce(dst=0)"] == column and all(a["reduce(dst=0)"] is None for a in after[1:])
assert all(a["all_gather"] == [v for b in before for v in b] for a in after)
assert [a["reduce_scatter"] for a in after] == [[c] for c in column]        # rank i: the sum of piece i
print("reduce_scatter: rank i holds the sum of piece i,", [a["reduce_scatter"] for a in after])

# %% all-reduce-written-by [markdown]
# ## 4 · An all-reduce written by hand: the ring (环形 all-reduce)
# NCCL and gloo implement `all_reduce` so that each rank sends only about 2× its data, whatever the number of
# ranks. The **ring** algorithm: split the tensor into `world` chunks; then
# 1. **reduce-scatter**: `world-1` steps; each rank sends one chunk to its right neighbour, receives one from
#    its left and adds it. Afterwards rank *r* holds the complete sum of chunk *(r+1) mod world*;
# 2. **all-gather**: `world-1` more steps passing the finished chunks around, until everyone has all of them.
#
# We run it on a random tensor and compare with `dist.all_reduce`.

# %% all-reduce-written-by-ddp
# %%ddp -n $world_size --timeout 60 --pull err
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def ring_all_reduce(tensor):
    buf = tensor.clone()
    chunks = list(buf.tensor_split(world))       # views into buf: world pieces
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):                # 1) reduce-scatter
        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world
        incoming = torch.empty_like(chunks[recv_i])
        req = dist.isend(chunks[send_i].clone(), dst=right)   # isend: no deadlock when all send first
        dist.recv(incoming, src=left)
        req.wait()
        chunks[recv_i] += incoming
    for step in range(world - 1):                # 2) all-gather
        send_i, recv_i = (rank - step + 1) % world, (rank - step) % world
        incoming = torch.empty_like(chunks[recv_i])
        req = dist.isend(chunks[send_i].clone(), dst=right)
        dist.recv(incoming, src=left)
        req.wait()
        chunks[recv_i].copy_(incoming)
    return buf

torch.manual_seed(rank)
x = torch.randn(1000)
mine = ring_all_reduce(x)
theirs = x.clone(); dist.all_reduce(theirs)
err = (mine - theirs).abs().max().item()
print(f"rank {rank}: max |ring - all_reduce| = {err:.2e}")
dist.destroy_process_group()

# %% check [markdown]
# ## Check

# %% check-code
errs = err                                   # --pull err: one number per rank
assert len(errs) == world_size and max(errs) < 1e-4, errs
print("ok: the hand-written ring all-reduce equals dist.all_reduce on every rank; max error", max(errs))

# %% exercise [markdown]
# ## Exercise
# Write `ring_all_gather(t)` using only `isend`/`recv` (each rank contributes one tensor; afterwards every
# rank has the list of all of them, in rank order) and check it against `dist.all_gather`.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your ring_all_gather here, in a cell that starts with
#   %%ddp -n $world_size --timeout 60 --pull same
# where each rank sets `same` to whether its result equals dist.all_gather's (True / False).

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull same
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def ring_all_gather(t):
    out = [torch.empty_like(t) for _ in range(world)]
    out[rank] = t.clone()
    for step in range(world - 1):
        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world
        req = dist.isend(out[send_i], dst=(rank + 1) % world)
        dist.recv(out[recv_i], src=(rank - 1) % world)
        req.wait()
    return out

t = torch.arange(3.0) + 10 * rank
ref = [torch.empty_like(t) for _ in range(world)]; dist.all_gather(ref, t)
same = all(torch.equal(a, b) for a, b in zip(ring_all_gather(t), ref))
print(f"rank {rank}: ring all_gather equal: {same}")
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "same" in globals(), "✗ nothing to check yet: your cell should end with --pull same"
assert len(same) == world_size, f"✗ {len(same)} values pulled for {world_size} ranks"
assert same == [True] * world_size, f"✗ ranks {[r for r, s in enumerate(same) if not s]} got a list different from dist.all_gather's: send out[(rank - step) % world] to the next rank, receive out[(rank - step - 1) % world] from the previous"
print("✓ the ring all_gather equals dist.all_gather on every rank")

# %% mistake tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull same
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

def ring_all_gather(t):
    out = [torch.empty_like(t) for _ in range(world)]
    out[rank] = t.clone()
    for step in range(world - 1):
        req = dist.isend(out[rank], dst=(rank + 1) % world)       # always its own tensor, not the one just received
        dist.recv(out[(rank - step - 1) % world], src=(rank - 1) % world)
        req.wait()
    return out

t = torch.arange(3.0) + 10 * rank
ref = [torch.empty_like(t) for _ in range(world)]; dist.all_gather(ref, t)
same = all(torch.equal(a, b) for a, b in zip(ring_all_gather(t), ref))
dist.destroy_process_group()
# expect: ✗ ranks \[[0-9, ]+\] got a list different from dist\.all_gather
