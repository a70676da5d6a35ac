# %% title [markdown]
# # 07 · Multi-node configuration (多机配置)
#
# On several machines you start **one launcher per machine**, each with the same job shape and its own
# `--node_rank`:
#
# | option | same on every node? | meaning |
# |---|---|---|
# | `--nnodes` | yes | number of machines |
# | `--nproc_per_node` | usually (torchrun allows different counts: end of section 1) | processes (GPUs) on this machine |
# | `--node_rank` | **no**: 0, 1, … | which machine this is (static rendezvous only: a c10d rendezvous, section 4's, ignores it and numbers the nodes itself) |
# | `--master_addr` | yes | address of node 0, reachable from all nodes (not `localhost`: section 5) |
# | `--master_port` | yes | a free port on node 0, open in the firewall |
#
# We cannot borrow a cluster, but `%%ddp --nnodes` runs all nodes' processes here with exactly the variables
# each would get on its own machine; section 1 prints the torchrun command each node would run.

# %% parameters tags=["parameters"]
nnodes = 2
nproc_per_node = 2         # 4 ranks: each node's group has 2 ranks, so "inside a node" differs from "all"
master_addr = "10.0.0.1"   # node 0 of an imaginary cluster
master_port = 29500
hang_timeout = 3           # seconds the hang of section 5 may wait (torchrun's own default: 900)

# %% load-ext
# %load_ext nbddp

# %% commands-one-per-node [markdown]
# ## 1 · The commands, one per node

# %% commands-one-per-node-code
from nbddp.core.launchrules import make_spec
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
# **Nodes of different sizes.** `%%ddp` simulates nodes with the same number of processes, and most clusters
# have them, so rank = node_rank × nproc_per_node + local_rank. torchrun itself does not require it: its agents
# write each node's `--nproc-per-node` to the store, and node 0's agent numbers the ranks node by node, each
# node's first rank being the count of processes on the nodes before it; `WORLD_SIZE` is the sum
# (`_assign_worker_ranks` in `torch/distributed/elastic/agent/server/api.py`; the formula above is its shortcut
# when `TORCH_ELASTIC_WORKER_IDENTICAL=1`). Two real torchruns on this machine, with 2 and 1 processes:

# %% uneven-nodes-code
import os, shutil, socket, subprocess, sys
shutil.rmtree("runs/07/whoami", ignore_errors=True); os.makedirs("runs/07/whoami")
with open("runs/07/whoami.py", "w") as f:       # each rank writes its numbers to runs/07/whoami/<RANK>
    f.write("import os\n"
            "numbers = ' '.join(os.environ[k] for k in ('GROUP_RANK', 'LOCAL_RANK', 'RANK', 'WORLD_SIZE'))\n"
            "open(f\"runs/07/whoami/{os.environ['RANK']}\", 'w').write(numbers)\n")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
env = {k: v for k, v in os.environ.items() if k != "TORCH_ELASTIC_WORKER_IDENTICAL"}
uneven = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={n}",
                            f"--node-rank={i}", "--master-addr=127.0.0.1", f"--master-port={port}",
                            "--rdzv-conf=timeout=60", "runs/07/whoami.py"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
          for i, n in enumerate((2, 1))]
try:
    uneven_out = [node.communicate(timeout=120)[0] for node in uneven]
finally:
    for node in uneven:
        node.kill() if node.poll() is None else None
seen_uneven = sorted(tuple(int(x) for x in open(f"runs/07/whoami/{name}").read().split())
                     for name in os.listdir("runs/07/whoami"))
for group_rank, local_rank, rank, world in seen_uneven:
    print(f"node {group_rank}  local_rank {local_rank}  ->  rank {rank} of WORLD_SIZE {world}")
assert all(node.returncode == 0 for node in uneven), uneven_out
assert seen_uneven == [(0, 0, 0, 3), (0, 1, 1, 3), (1, 0, 2, 3)], uneven_out     # 2 + 1 processes: ranks 0 1 | 2

# %% uneven-nodes-note [markdown]
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
# rendezvous on the job's first node (`scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1`), which hosts
# the store (`is_host=true` there), under a random rendezvous id per job (`PET_RDZV_ID`, in torchrun's
# environment): the job id, which `squeue` shows every user, would let anyone on the cluster find the store
# and write to it. `%ddp_export` without a cell exports the last `%%ddp` cell: section 2's.

# %% same-cell-under-slurm-code
# %ddp_export runs/07/train_slurm.py --slurm --nnodes $nnodes --nproc-per-node $nproc_per_node --time 00:10:00

# %% same-cell-under-slurm-code-2
job = open("runs/07/train_slurm.sbatch").read()
assert f"#SBATCH --nodes={nnodes}" in job and "srun " in job and "PET_RDZV_ID=" in job and "is_host=" in job
assert "SLURM_JOB_ID" not in job, "the rendezvous must not come from the job id, which squeue shows every user"
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

# %% hang-master-addr-itself [markdown]
# ## 5 · The classic hang: node 1's `--master_addr` points at itself
# Every node must name **node 0** as its `--master_addr`, as the other machines reach it. The hang comes from
# writing the address as each machine sees it: `--master_addr=localhost` (or `127.0.0.1`, or its own hostname,
# or no `--master_addr` at all: torchrun's default is `127.0.0.1`) on node 1. Node 0 hosts the meeting point,
# a TCPStore on `--master_port`, and waits for the other node; node 1 knocks at its own door, where nobody
# listens. Nothing fails for a long time, and nothing says why: torchrun waits 900 s by default (`default_timeout` in
# `torch/distributed/launcher/api.py`), and your script has not even started — the wait is in torchrun's own
# rendezvous (`torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py`).
#
# Below, both nodes are real `torchrun` processes on this machine. Both "machines" share one `localhost` here, so
# node 1's own machine is played by a port where nothing listens: node 1 dials `127.0.0.1` at a port node 0 does
# not serve, which is what it finds at home. `--rdzv-conf timeout=3` cuts the wait to 3 seconds (torch's
# message says a second more: "after 4 seconds" here, as it says "after 901 seconds" with the default 900).

# %% hang-master-addr-itself-code
import os, socket, subprocess, sys, time
os.makedirs("runs/07", exist_ok=True)
with open("runs/07/train.py", "w") as f:
    f.write("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "t = torch.ones(1); dist.all_reduce(t)\n"
            "print(f'rank {dist.get_rank()}: all_reduce gave {t.item():.0f}')\n")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]          # node 0's meeting point
home = socket.socket(); home.bind(("127.0.0.1", 0))              # "node 1 itself": bound, nobody listening
torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={nproc_per_node}",
            f"--rdzv-conf=timeout={hang_timeout}"]
node_options = [["--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={port}"],
                ["--node-rank=1", "--master-addr=127.0.0.1", f"--master-port={home.getsockname()[1]}"]]
started = time.monotonic()
nodes = [subprocess.Popen(torchrun + options + ["runs/07/train.py"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) for options in node_options]
hang_out = [node.communicate(timeout=120)[0] for node in nodes]
home.close()
print(f"both gave up after {time.monotonic() - started:.0f} s (torch imports included):")
for i, out in enumerate(hang_out):
    print(f"node {i}, exit code {nodes[i].returncode}:", [line for line in out.splitlines() if "Error: " in line][-1])

# %% hang-master-addr-itself-check
assert all(node.returncode != 0 for node in nodes), hang_out
assert "1/2 clients joined" in hang_out[0], hang_out[0][-2000:]                                  # node 0 waited for node 1
assert f"trying to connect to (127.0.0.1, {node_options[1][2].split('=')[1]})" in hang_out[1], hang_out[1][-2000:]
assert not any("all_reduce gave" in out for out in hang_out)      # the script never ran: the wait is in torchrun
waited = re.search(r"Timed out after (\d+) seconds waiting for clients", hang_out[0])
assert waited and hang_timeout <= int(waited[1]) <= hang_timeout + 2, hang_out[0][-2000:]   # 3 s asked, 4 reported

# %% hang-master-addr-itself-note [markdown]
# Node 0 waited for clients ("1/2 clients joined": itself only), node 1 for an answer at its own address. **Fix**:
# the same `--master_addr` and `--master_port` on every node, node 0's, as in section 1's commands. To test it
# before a long job: while node 0 waits, `python -c "import socket; socket.create_connection(('10.0.0.1', 29500), 3)"`
# on node 1 must return without an error; a refusal or a timeout means the address, the port or a firewall.
#
# ## 6 · Which network: `GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`, `NCCL_DEBUG=INFO`
# The store only introduces the ranks; then gloo or NCCL opens its own connections between them, over a network
# interface each backend picks on its machine. A machine with several (Ethernet, InfiniBand, `docker0`, a VPN)
# can offer one the other machines cannot reach: the rendezvous succeeds, and `init_process_group` or the first
# collective hangs. Name the interface yourself, the same on every node:
#
# | variable | for | example |
# |---|---|---|
# | `GLOO_SOCKET_IFNAME` | gloo (CPU tensors) | `GLOO_SOCKET_IFNAME=eth0` |
# | `NCCL_SOCKET_IFNAME` | NCCL's socket traffic and bootstrap | `NCCL_SOCKET_IFNAME=eth0`, or `^docker0,lo` to exclude |
# | `NCCL_DEBUG=INFO` | NCCL says what it chose, per rank | lines like `NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>`, or `NET/IB : Using [0]mlx5_0:1/IB` |
#
# `NCCL_DEBUG=INFO` (with `NCCL_DEBUG_SUBSYS=INIT,NET` to keep it short) is the first thing to set when a
# multi-node NCCL job hangs or crawls: `NET/Socket` where you expected InfiniBand means TCP, a `docker0`
# address means a network the other node cannot see. NCCL needs GPUs; gloo shows the same thing here. The
# simulated nodes all talk over the loopback, so naming it works, and a name this machine does not have fails
# at once, as it would on a node whose interface is called differently:

# %% which-network-code
import socket
from nbddp import DDPError
loopback = next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
net_cell = '''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t)
print(f"GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']}: all_reduce gave {t.item():.0f}")
dist.destroy_process_group()
'''
over = {}
for ifname in (loopback, "no_such_if0"):
    try:
        get_ipython().run_cell_magic("ddp", f"--timeout 60 --nnodes {nnodes} --nproc-per-node {nproc_per_node} --ranks 0 "
                                     f"--output text --env GLOO_SOCKET_IFNAME={ifname}", net_cell)
        over[ifname] = "ok"
    except DDPError as exc:
        over[ifname] = exc.result.ranks[0].cause

# %% which-network-check
assert over[loopback] == "ok", over
assert "Unable to find address for: no_such_if0" in over["no_such_if0"], over
print({name: why.rsplit("] ", 1)[-1] for name, why in over.items()})      # gloo's own message, without its path

# %% exercise [markdown]
# ## Exercise
# The cluster: 2 machines with 4 GPUs each; node 0's address is `master_addr` (`10.0.0.1`), the port
# `master_port` (29500). Write the command you type **on node 1** to start `train.py` there, as the string
# `node1_command`, and the global rank of the process on node 1's GPU 1 as `rank_of_node1_gpu1`. Then confirm
# the rank by simulating the cluster: a `%%ddp` cell on 2 nodes of 4 processes in which every rank sets
# `placed = (GROUP_RANK, LOCAL_RANK)` (ints, from `os.environ`), pulled back with `--pull placed`.
# The check reads your command with torchrun's own parser (`torch.distributed.run.get_args_parser()`), as
# torchrun on node 1 would.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# node1_command = "torchrun ..."     # what you type on node 1
# rank_of_node1_gpu1 = ...           # the global rank of the process on node 1's GPU 1
# then, in a new cell:
#   %%ddp --nnodes 2 --nproc-per-node 4 --timeout 60 --pull placed

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-answers tags=["solution"]
node1_command = (f"torchrun --nnodes=2 --nproc-per-node=4 --node-rank=1 "
                 f"--master-addr={master_addr} --master-port={master_port} train.py")
rank_of_node1_gpu1 = 1 * 4 + 1       # node_rank x nproc_per_node + local_rank (LOCAL_RANK = the GPU)

# %% solution-ddp tags=["solution"]
# %%ddp --nnodes 2 --nproc-per-node 4 --ranks 5 --timeout 60 --pull placed
import os
placed = (int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]))
print(f"rank {os.environ['RANK']}: node {placed[0]}, cuda:{placed[1]}")

# %% check-answer tags=["check"]
assert "node1_command" in globals() and "rank_of_node1_gpu1" in globals(), "✗ nothing to check yet: set node1_command and rank_of_node1_gpu1"
import shlex
from torch.distributed.run import get_args_parser
words = shlex.split(node1_command)
words = words[1:] if words[:1] == ["torchrun"] else words[3:] if words[1:3] == ["-m", "torch.distributed.run"] else None
assert words is not None, "✗ start the command with torchrun (or python -m torch.distributed.run)"
try:
    node1_args = get_args_parser().parse_args(words)
except SystemExit:
    node1_args = None
assert node1_args is not None, "✗ torchrun's parser rejects that command (its error is printed above)"
assert node1_args.nnodes in ("2", "2:2"), f"✗ --nnodes {node1_args.nnodes}: the number of machines, 2, the same on every node"
assert node1_args.nproc_per_node in ("4", "gpu", "auto"), f"✗ --nproc-per-node {node1_args.nproc_per_node}: the processes on this machine, one per GPU (4), not in the whole job"
assert node1_args.node_rank == 1, f"✗ --node-rank {node1_args.node_rank}: node 1 must say 1; two machines that both say 0 claim ranks 0-3 twice and nobody is node 1"
assert not node1_args.standalone, "✗ --standalone is for one machine: torchrun then hosts its own c10d rendezvous at localhost on a free port and ignores --master-addr, so node 1 waits alone for a second node"
assert node1_args.rdzv_backend == "static", f"✗ --rdzv-backend {node1_args.rdzv_backend}: node 0's command (section 1) meets at the static rendezvous on --master-addr:--master-port; a node on another backend never joins it"
assert not node1_args.rdzv_endpoint or node1_args.rdzv_endpoint == f"{master_addr}:{master_port}", f"✗ --rdzv-endpoint {node1_args.rdzv_endpoint}: with the static rendezvous it replaces --master-addr:--master-port as the meeting point; leave it out (node 0's command has none)"
assert not node1_args.master_addr.startswith(("127.", "localhost")) and node1_args.master_addr != "::1", f"✗ --master-addr {node1_args.master_addr} (the default when none is given is 127.0.0.1): on node 1 that is node 1 itself, where nobody hosts the meeting point: the hang of section 5"
assert node1_args.master_addr == master_addr, f"✗ --master-addr {node1_args.master_addr}: every node names node 0, {master_addr}"
assert (node1_args.master_port or 29500) == master_port, f"✗ --master-port {node1_args.master_port}: every node names node 0's port, {master_port}"
assert rank_of_node1_gpu1 != 1, "✗ rank 1 is the LOCAL_RANK (the GPU index on node 1): the global rank counts node 0's 4 processes first"
assert rank_of_node1_gpu1 != 1 * 2 + 1, "✗ rank 3 is node_rank x nnodes + local_rank: node 1's ranks start after node 0's 4, so multiply by nproc_per_node"
assert rank_of_node1_gpu1 == 5, f"✗ rank {rank_of_node1_gpu1}: global rank = node_rank x nproc_per_node + local_rank"
assert "placed" in globals() and len(placed) == 8, "✗ now confirm it: simulate the cluster with %%ddp --nnodes 2 --nproc-per-node 4 ... --pull placed"
assert tuple(placed[rank_of_node1_gpu1]) == (1, 1), f"✗ the simulated rank {rank_of_node1_gpu1} says node {placed[rank_of_node1_gpu1][0]}, cuda:{placed[rank_of_node1_gpu1][1]}: set placed = (GROUP_RANK, LOCAL_RANK)"
print(f"✓ on node 1:  {node1_command}\n  its GPU 1 runs rank 1 x 4 + 1 = 5; the simulated cluster agrees")

# %% mistake tags=["mistake"]
node1_command = f"torchrun --nnodes=2 --nproc-per-node=4 --node-rank=0 --master-addr={master_addr} --master-port={master_port} train.py"
rank_of_node1_gpu1 = 5               # node 0's command copied as it is
# expect: ✗ --node-rank 0: node 1 must say 1

# %% mistake-master-addr-localhost tags=["mistake"]
node1_command = f"torchrun --nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr=localhost --master-port={master_port} train.py"
rank_of_node1_gpu1 = 5
# expect: ✗ --master-addr localhost .*the hang of section 5

# %% mistake-nproc-whole-job tags=["mistake"]
node1_command = f"torchrun --nnodes=2 --nproc-per-node=8 --node-rank=1 --master-addr={master_addr} --master-port={master_port} train.py"
rank_of_node1_gpu1 = 5               # all 8 GPUs of the job counted as this node's
# expect: ✗ --nproc-per-node 8

# %% mistake-standalone tags=["mistake"]
node1_command = f"torchrun --standalone --nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr={master_addr} --master-port={master_port} train.py"
rank_of_node1_gpu1 = 5               # --standalone kept from a single-machine command
# expect: ✗ --standalone is for one machine

# %% mistake-rdzv-endpoint-localhost tags=["mistake"]
node1_command = f"torchrun --nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr={master_addr} --master-port={master_port} --rdzv-endpoint=localhost:29500 train.py"
rank_of_node1_gpu1 = 5
# expect: ✗ --rdzv-endpoint localhost:29500

# %% mistake-times-nnodes tags=["mistake"]
node1_command = f"torchrun --nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr={master_addr} --master-port={master_port} train.py"
rank_of_node1_gpu1 = 1 * 2 + 1       # node_rank x nnodes + local_rank
# expect: ✗ rank 3 is node_rank x nnodes
