# %% title [markdown]
# # 07 · Multi-node configuration (多机配置)
#
# On several machines you start **one launcher per machine**, each with the same job shape and its own
# `--node_rank`:
#
# | option | same on every node? | meaning |
# |---|---|---|
# | `--nnodes` | yes | number of machines |
# | `--nproc_per_node` | yes | processes (GPUs) per machine |
# | `--node_rank` | **no**: 0, 1, … | which machine this is |
# | `--master_addr` | yes | address of node 0, reachable from all nodes (not `localhost`!) |
# | `--master_port` | yes | a free port on node 0, open in the firewall |
#
# We cannot borrow a cluster, but `%%ddp --nnodes` runs all nodes' processes here with exactly the variables
# each would get on its own machine, and `nbddp.export` prints the commands you would type on each node.

# %% parameters tags=["parameters"]
nnodes = 2
nproc_per_node = 1
master_addr = "10.0.0.1"   # node 0 of an imaginary cluster
master_port = 29500

# %% load-ext
# %load_ext nbddp

# %% commands-one-per-node [markdown]
# ## 1 · The commands, one per node

# %% commands-one-per-node-code
from nbddp.core.spec import make_spec
from nbddp.export import node_commands
spec = make_spec(nproc_per_node=nproc_per_node, nnodes=nnodes, master_addr=master_addr, master_port=master_port)
commands = node_commands(spec, "train.py")
for node, command in enumerate(commands):
    print(f"on node {node}:  {command}")

# %% commands-one-per-node-note [markdown]
# `%ddp_export` does the same for a real cell: it writes the cell as a script and prints the commands
# (section 3). Before torchrun, the same with the old launcher was
# `python -m torch.distributed.launch --nnodes=2 --node_rank=0 --nproc_per_node=… --master_addr=… --master_port=… train.py`.
#
# ## 2 · The job, simulated on this machine
# Each rank reports its node and local rank, and the job checks that communication works **across** nodes
# (a global all-reduce) and **inside** a node (a `new_group` with the node's ranks — how hierarchical schemes
# keep traffic on the fast local links).

# %% commands-one-per-node-ddp
# %%ddp --nnodes $nnodes --nproc-per-node $nproc_per_node --timeout 60 --pull sums
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node, local, per_node = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(world // per_node)]
t = torch.tensor([float(rank)]); dist.all_reduce(t)                          # all nodes
u = torch.tensor([float(rank)]); dist.all_reduce(u, group=groups[node])     # my node only
sums = {"node": node, "local": local, "global sum": t.item(), "node sum": u.item()}
print(f"node {node} local {local} rank {rank}: global sum {t.item():.0f}, node sum {u.item():.0f}")
dist.destroy_process_group()

# %% check [markdown]
# ## Check

# %% check-code
import re
world = nnodes * nproc_per_node
assert len(_ddp.ranks) == world and _ddp.ok
for r in _ddp.ranks:
    node, local = r.rank // nproc_per_node, r.rank % nproc_per_node
    node_sum = sum(range(node * nproc_per_node, (node + 1) * nproc_per_node))
    expect = {"node": node, "local": local, "global sum": sum(range(world)), "node sum": node_sum}
    assert sums[r.rank] == expect, (r.rank, sums[r.rank], expect)      # --pull sums: one dict per rank
    assert (r.node_rank, r.local_rank) == (node, local)
assert len(commands) == nnodes and all(f"--node-rank={i}" in c for i, c in enumerate(commands))
assert all(f"--master-addr={master_addr}" in c and f"--master-port={master_port}" in c for c in commands)
print("ok: ranks, nodes and both groups are as configured")

# %% export-cell-for-cluster [markdown]
# ## 3 · Export the cell for the cluster

# %% export-cell-for-cluster-ddp
# %%ddp_export runs/07/train_multinode.py --nnodes $nnodes --nproc-per-node $nproc_per_node --master-addr $master_addr --master-port $master_port
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {t.item():.0f}")
dist.destroy_process_group()

# %% export-cell-for-cluster-code
script = open("runs/07/train_multinode.py").read()
assert "dist.all_reduce(t)" in script and f"--node-rank={nnodes - 1}" in script
print(script[-600:])

# %% same-cell-under-slurm [markdown]
# ## 4 · The same cell under Slurm
# Most clusters run jobs through Slurm. `--slurm` also writes a batch job next to the script: one task per
# node (`--ntasks-per-node=1`), each task a torchrun that starts the node's ranks, all meeting at a c10d
# rendezvous on the job's first node (`scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1`) with the
# job id as rendezvous id. `%ddp_export` without a cell exports the last `%%ddp` cell: section 2's.

# %% same-cell-under-slurm-code
# %ddp_export runs/07/train_slurm.py --slurm --nnodes $nnodes --nproc-per-node $nproc_per_node --time 00:10:00

# %% same-cell-under-slurm-code-2
job = open("runs/07/train_slurm.sbatch").read()
assert f"#SBATCH --nodes={nnodes}" in job and "srun " in job and '--rdzv-id="$SLURM_JOB_ID"' in job
print(job)

# %% same-cell-under-slurm-note [markdown]
# On the cluster: `sbatch train_slurm.sbatch` (from the script's folder; `PYTHON=/path/to/env/bin/python` in
# front chooses the interpreter). From a notebook on the cluster's login node, or inside `salloc`,
# `%%ddp --launcher slurm --nnodes 2 -n 2` runs a cell on Slurm's nodes with the same live display and errors.
# Where this notebook finds Slurm (`sinfo`), the next cell runs section 2's cell so; elsewhere it says why not.

# %% same-cell-under-slurm-ddp
import shutil, subprocess
slurm_nodes = 0
if shutil.which("sinfo"):
    listed = subprocess.run(["sinfo", "-h", "-N", "-t", "idle,mix", "-o", "%N"], capture_output=True, text=True)
    slurm_nodes = len(set(listed.stdout.split()))
if slurm_nodes:
    on = min(nnodes, slurm_nodes)
    lesson_cell = open("runs/07/train_slurm.py").read()      # section 2's cell, as exported
    get_ipython().run_cell_magic("ddp", f"--launcher slurm --nnodes {on} --nproc-per-node {nproc_per_node} --timeout 300",
                                 lesson_cell)
    assert _ddp.ok and len(_ddp.ranks) == on * nproc_per_node
    print(f"ok: the cell ran under Slurm on {on} node(s)")
else:
    print("No Slurm here (sinfo not found or no idle node): on a cluster this cell runs section 2's cell "
          "with %%ddp --launcher slurm. scripts/setup-slurm.sh starts a one-machine Slurm to try it.")

# %% exercise [markdown]
# ## Exercise
# The cluster has 2 machines with 4 GPUs each. Which `node_rank`, `LOCAL_RANK` (= which GPU) does global rank 5
# have? Verify by simulating the cluster with `%%ddp` and showing rank 5 only, and print node 1's command.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your answer here; confirm it in a cell that starts with
#   %%ddp --nnodes 2 --nproc-per-node 4 --ranks 5 --timeout 60 --pull where@5
# where every rank sets `where = (int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]))`.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp --nnodes 2 --nproc-per-node 4 --ranks 5 --timeout 60 --pull where@5
import os
where = (int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]))
print(f"rank {os.environ['RANK']}: node {where[0]}, cuda:{where[1]}")

# %% check-answer tags=["check"]
assert "where" in globals(), "✗ nothing to check yet: your cell should end with --pull where@5"
assert tuple(where) == (1, 1), f"✗ rank 5 is node {where[0]}, local rank {where[1]}: with 4 per node, 5 = 1 x 4 + 1"
print("✓ rank 5 runs on node 1 with cuda:1; node 1's command:")
print(node_commands(make_spec(nproc_per_node=4, nnodes=2, master_addr=master_addr, master_port=master_port), "train.py")[1])
