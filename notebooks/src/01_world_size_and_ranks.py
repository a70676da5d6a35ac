# %% title [markdown]
# # 01 · World size, rank, local rank, master address and port
#
# A distributed job is a set of processes that cooperate. These environment variables tell each process who it is:
#
# | term | 中文 | meaning |
# |---|---|---|
# | `WORLD_SIZE` | 世界大小 | how many processes take part in the whole job (all machines) |
# | `RANK` | 全局秩 (rank) | this process's number in the job, `0 … WORLD_SIZE-1`; rank 0 is usually the "main" one |
# | `LOCAL_RANK` | 本地秩 | its number **on its machine**, `0 … nproc_per_node-1`; picks the GPU: `cuda:LOCAL_RANK`, so `nproc_per_node` must not exceed the machine's GPUs (recent torchrun's `--virtual-local-rank`, pytorch#166680, instead sets `LOCAL_RANK=0` and shows each process only its own GPU in `CUDA_VISIBLE_DEVICES`) |
# | `GROUP_RANK` (node_rank) | 节点秩 | which machine (node) it runs on, `0 … nnodes-1`: torchrun's `--node-rank` with its default static rendezvous; with `--rdzv-backend c10d` the rendezvous numbers the nodes itself and ignores `--node-rank` |
# | `MASTER_ADDR` / `MASTER_PORT` | 主节点地址 / 端口 | where every process meets the others at start (rank 0's machine) |
#
# When every node runs the same `nproc_per_node` (as `%%ddp` simulates it, and as most clusters do), they are
# tied together by one formula:
#
# **global rank = node_rank × nproc_per_node + local_rank**, and **world size = nnodes × nproc_per_node**.
#
# (torchrun also accepts nodes with different counts: it numbers the ranks node by node, each node's first rank
# being the number of processes on the nodes before it, and `WORLD_SIZE` is the sum of every node's
# `--nproc-per-node`; lesson 07 runs such a job.)
#
# `%%ddp` runs a cell as such a job on this machine, and with `--nnodes` it *simulates* several machines, so
# the arithmetic can be seen without a cluster.

# %% parameters tags=["parameters"]
world_size = 2        # ranks for the first cell
nnodes = 2            # simulated machines for the layout
nproc_per_node = 2    # ranks per simulated machine

# %% load-ext
# %load_ext nbddp

# %% every-rank-reads-who [markdown]
# ## 1 · Every rank reads who it is
# The launcher (torchrun, or `%%ddp`) puts the numbers in environment variables; `init_process_group`
# reads them (`env://`) and then `dist.get_rank()` / `dist.get_world_size()` agree with them.

# %% every-rank-reads-who-ddp
# %%ddp -n $world_size --timeout 60 --pull seen
import os, torch.distributed as dist
dist.init_process_group("gloo")
seen = {"RANK": int(os.environ["RANK"]), "WORLD_SIZE": int(os.environ["WORLD_SIZE"]),
        "meeting point": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "get_rank()": dist.get_rank(), "get_world_size()": dist.get_world_size()}
print(seen)
dist.destroy_process_group()

# %% every-rank-reads-who-code
for rank, s in enumerate(seen):          # `seen` came back from every rank (--pull seen), indexed by rank
    assert s["RANK"] == s["get_rank()"] == rank and s["WORLD_SIZE"] == s["get_world_size()"] == world_size, s
ports = {s["meeting point"] for s in seen}
assert len(ports) == 1, ports          # every rank meets at the same address:port
print("all ranks agree on the meeting point", ports.pop())

# %% simulated-nodes-layout [markdown]
# ## 2 · Simulated nodes: the layout
# `--nnodes 2 --nproc-per-node 2` gives 4 ranks as if on 2 machines with 2 processes each. Each rank prints
# its node (`GROUP_RANK`), local rank and global rank; `--pull layout` collects them.

# %% simulated-nodes-layout-ddp
# %%ddp --nnodes $nnodes --nproc-per-node $nproc_per_node --timeout 60 --pull layout
import os
layout = {k: int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")}

# %% simulated-nodes-layout-code
for me in layout:
    print(f"node {me['GROUP_RANK']}  local_rank {me['LOCAL_RANK']}  ->  rank {me['RANK']}"
          f" = {me['GROUP_RANK']} x {me['LOCAL_WORLD_SIZE']} + {me['LOCAL_RANK']}")

# %% local-rank-is-not-rank [markdown]
# > **"`LOCAL_RANK` = `RANK`"**, as some articles put it, holds on one machine only (and on node 0 of any job).
# > On node 1 above, rank 2 has local rank 0. Code that picks its GPU with `RANK` asks node 1 for `cuda:2` and
# > `cuda:3` on a 2-GPU machine; code that passes `rank=LOCAL_RANK` to `init_process_group` gives ranks 0 and 1
# > twice, and ranks 2 and 3, which every process waits for at the start, never come. `LOCAL_RANK` picks the
# > device, `RANK` says who you are in the job.

# %% local-rank-is-not-rank-code
differ = [m["RANK"] for m in layout if m["RANK"] != m["LOCAL_RANK"]]
print("ranks whose LOCAL_RANK is not their RANK:", differ)
assert bool(differ) == (nnodes > 1), differ      # equal everywhere only on a single node

# %% simulated-nodes-layout-note [markdown]
# The same as a picture: one row per node, one box per process.

# %% simulated-nodes-layout-code-2
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(1.8 * nproc_per_node + 1.5, 1.1 * nnodes + 0.8))
for me in layout:
    x, y = me["LOCAL_RANK"], nnodes - 1 - me["GROUP_RANK"]
    ax.add_patch(plt.Rectangle((x + 0.05, y + 0.08), 0.9, 0.84, color=f"C{me['GROUP_RANK']}", alpha=0.35))
    ax.text(x + 0.5, y + 0.6, f"rank {me['RANK']}", ha="center", fontsize=12, weight="bold")
    ax.text(x + 0.5, y + 0.3, f"local {me['LOCAL_RANK']}", ha="center", fontsize=9)
ax.set_xlim(0, nproc_per_node); ax.set_ylim(0, nnodes)
ax.set_xticks([i + 0.5 for i in range(nproc_per_node)], [f"LOCAL_RANK {i}" for i in range(nproc_per_node)])
ax.set_yticks([nnodes - 1 - n + 0.5 for n in range(nnodes)], [f"node {n}" for n in range(nnodes)])
ax.set_title(f"WORLD_SIZE = {nnodes} nodes x {nproc_per_node} = {nnodes * nproc_per_node}")
plt.show()

# %% check [markdown]
# ## Check

# %% check-code
assert len(layout) == nnodes * nproc_per_node
assert sorted(m["RANK"] for m in layout) == list(range(nnodes * nproc_per_node))
for m in layout:
    assert m["RANK"] == m["GROUP_RANK"] * nproc_per_node + m["LOCAL_RANK"], m
    assert m["WORLD_SIZE"] == nnodes * nproc_per_node and m["LOCAL_WORLD_SIZE"] == nproc_per_node
print("ok: global rank = node_rank x nproc_per_node + local_rank for every rank")

# %% exercise [markdown]
# ## Exercise
# A job runs on 3 machines with 2 processes each. Which global rank has local rank 1 on node 2, and what is
# the world size? Work it out and write the two numbers down as `answer_rank` and `answer_world`; then confirm
# them by simulating the job: a `%%ddp` cell on 3 nodes of 2 processes in which every rank sets
# `who = (GROUP_RANK, LOCAL_RANK)` (ints, from `os.environ`), pulled back with `--pull who`.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# answer_rank = ...     # the global rank of local rank 1 on node 2
# answer_world = ...    # the world size
# then, in a new cell:
#   %%ddp --nnodes 3 --nproc-per-node 2 --timeout 60 --pull who

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-answers tags=["solution"]
answer_rank = 2 * 2 + 1      # node_rank x nproc_per_node + local_rank: nodes 0 and 1 hold ranks 0-3
answer_world = 3 * 2         # nnodes x nproc_per_node

# %% solution-ddp tags=["solution"]
# %%ddp --nnodes 3 --nproc-per-node 2 --ranks 5 --timeout 60 --pull who
import os
who = (int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]))
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: node {who[0]}, local rank {who[1]}")

# %% check-answer tags=["check"]
assert "answer_rank" in globals() and "answer_world" in globals(), "✗ nothing to check yet: set answer_rank and answer_world"
assert answer_world == 6, f"✗ world size {answer_world}: WORLD_SIZE counts the processes of every machine, 3 x 2 = 6"
assert answer_rank != 1, "✗ rank 1 is the LOCAL_RANK: the global rank also counts the processes of nodes 0 and 1 before node 2"
assert answer_rank != 2 * 3 + 1, "✗ rank 7 is node_rank x nnodes + local_rank (and there is no rank 7 among 6): ranks are numbered machine by machine, so multiply the node rank by nproc_per_node"
assert answer_rank == 5, f"✗ rank {answer_rank}: global rank = node_rank x nproc_per_node + local_rank"
assert "who" in globals() and len(who) == 6, "✗ now confirm it: simulate the job with %%ddp --nnodes 3 --nproc-per-node 2 ... --pull who"
assert tuple(who[answer_rank]) == (2, 1), f"✗ the simulated rank {answer_rank} says node {who[answer_rank][0]}, local rank {who[answer_rank][1]}: set who = (GROUP_RANK, LOCAL_RANK)"
print("✓ local rank 1 on node 2 is global rank 2 x 2 + 1 = 5, in a world of 3 x 2 = 6; the simulated job agrees")

# %% mistake tags=["mistake"]
answer_rank = 1              # LOCAL_RANK taken for the global rank
answer_world = 6
# expect: ✗ rank 1 is the LOCAL_RANK

# %% mistake-times-nnodes tags=["mistake"]
answer_rank = 2 * 3 + 1      # node_rank x nnodes + local_rank
answer_world = 6
# expect: ✗ rank 7 is node_rank x nnodes

# %% mistake-world-is-nnodes tags=["mistake"]
answer_rank = 5
answer_world = 3             # the number of machines, not of processes
# expect: ✗ world size 3
