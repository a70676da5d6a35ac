# %% title [markdown]
# # 18 · Elastic jobs: nodes that join and leave a running job (`--nnodes 1:2`)
#
# Lesson 13 restarted a job whose **members stayed the same**: the same ranks, a lost one replaced. An
# **elastic** job lets the membership itself change. `torchrun --nnodes MIN:MAX` starts an *agent* per node;
# the agents meet at a **rendezvous** (`--rdzv-backend c10d --rdzv-endpoint HOST:PORT`) and the job runs
# with however many nodes came, between MIN and MAX:
#
# | event | what the agents do | what the ranks see | counts against `--max-restarts`? |
# |---|---|---|---|
# | a node **joins** (a spare machine comes up) | every agent stops its workers; a new rendezvous round with one more node | a fresh process, `WORLD_SIZE` up by that node's ranks, ranks renumbered | **no**: a membership change (`# membership changes do not count as retries`, `torch/distributed/elastic/agent/server/api.py`) |
# | a node **leaves** (dies, is preempted) | its peers' collectives fail, their workers fail, their agents restart them; a new round without it | a fresh process, `WORLD_SIZE` down, `TORCHELASTIC_RESTART_COUNT` up by one | **yes**: to the agents it is a failure |
#
# In both cases what is restarted is the **whole worker group**, on every node: no rank is added to or taken
# out of a running process group. So an elastic script does what lesson 13's did, plus one thing:
# it **checkpoints** often (what was computed since the last checkpoint is lost), **resumes** at every start,
# and derives its share of the work from `WORLD_SIZE` at every start, because that can differ each time.
#
# `%%ddp --nnodes 2` simulates nodes with a fixed count inside one launch (lesson 07). An elastic job needs
# one agent per node that comes and goes on its own, so here each node is **its own process** on this
# machine, both meeting on 127.0.0.1: node A starts alone, node B joins while A trains, then B is killed.

# %% parameters tags=["parameters"]
world_size = 2          # at most: 2 nodes of 1 process each (--nnodes 1:2 --nproc-per-node 1)
out_dir = "runs/18"

# %% load-ext
# %load_ext nbddp

# %% node-script [markdown]
# ## 1 · One node of the job
# The script below is one node: `python runs/18/node.py [torchrun's options] OUT_DIR STEPS`. It takes
# torchrun's options through **torchrun's own parser** and starts the node's agent with **torchrun's own
# launcher** (`config_from_args` and `elastic_launch`, the two calls `torch.distributed.run` makes), so
# `--nnodes=1:2` means what it means to torchrun. One difference, for this lesson's clock: the workers run the
# function `train`, started by a **forkserver** that imported torch once (`--start-method=forkserver`, which
# torchrun applies to a function, not to a script), so a restart does not import torch again (nbddp starts its
# ranks the same way); and the node imports all that first and joins only when the lesson tells it to (a file
# `A.go` or `B.go`), so that B can join within seconds.
#
# `train` is an ordinary DDP loop with the three habits of an elastic script: a checkpoint after every step
# (rank 0 writes it, atomically), a resume from it at every start, and a **global batch of 8 rows split by
# `WORLD_SIZE`**, so one step means the same gradient whether 1 or 2 ranks compute it. Each rank writes a
# line per step of what it saw: its node, rank, `WORLD_SIZE`, `TORCHELASTIC_RESTART_COUNT`, process id and step.
#
# One line a script should not need: `dist.barrier()` before `destroy_process_group()`. In torch 2.13 a gloo
# group's destructor waits, holding Python's GIL, for the group's worker thread, and that thread may still be
# releasing the last collective's tensor, which needs the GIL when Python made the tensor (here the stop flag):
# a deadlock, the worker stuck after its last step (seen in 3 of 10 runs of this job on this busy machine, in
# `c10d::ProcessGroupGloo::~ProcessGroupGloo`, called from DDP's `Reducer` as it was freed, under gdb; the
# kind of blocking destructor pytorch#56297 is about). A barrier has no tensor, and while the script waits for
# it the thread gets the GIL and finishes.

# %% node-script-code
import os, shutil
shutil.rmtree(out_dir, ignore_errors=True); os.makedirs(out_dir)

# %% node-script-file
# %%writefile runs/18/node.py
"""One node of an elastic job: `torchrun --nnodes 1:2 ...`, with torchrun's own parser and launcher."""
import json, os, sys, time


def train(out, total_steps):
    """The training script: a checkpoint after every step, resumed from at every start."""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    if os.path.exists(f"{out}/ckpt.pt"):                       # every start: go on from the last checkpoint
        state = torch.load(f"{out}/ckpt.pt")
        model.module.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); step = state["step"]
    while step < total_steps:
        stop = torch.tensor([float(os.path.exists(f"{out}/stop"))])   # the lesson ends the job: all ranks agree
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        g = torch.Generator().manual_seed(step)                # step `step`'s global batch: 8 rows
        x = torch.randn(8, 4, generator=g); y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        mine = slice(rank * 8 // world, (rank + 1) * 8 // world)   # this rank's share, at any WORLD_SIZE
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward(); opt.step()
        step += 1
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, f"{out}/ckpt.tmp")
            os.replace(f"{out}/ckpt.tmp", f"{out}/ckpt.pt")    # never a half-written checkpoint
        with open(f"{out}/log.jsonl", "a") as f:               # what this rank saw, one line per step
            f.write(json.dumps({"node": os.environ.get("GROUP_RANK", "0"), "rank": rank, "world": world,
                                "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                "pid": os.getpid(), "step": step, "t": time.time()}) + "\n")
        time.sleep(0.1)
    dist.barrier()   # before the group goes: see the note in §1
    dist.destroy_process_group()


if __name__ == "__main__":
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, get_args_parser
    import multiprocessing.forkserver
    multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed"])  # DDP imports _dynamo
    multiprocessing.forkserver.ensure_running()   # imports them now, once: each worker is then forked from it
    *options, out, steps = sys.argv[1:]
    go, deadline = f"{out}/{os.environ['NODE_NAME']}.go", time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:   # torch is imported: join when told
        time.sleep(0.05)
    config, _, _ = config_from_args(get_args_parser().parse_args(options + ["train.py"]))
    elastic_launch(config, train)(out, int(steps))

# %% start-nodes [markdown]
# ## 2 · Two nodes, started and waiting
# Both nodes get the same options: `--nnodes=1:2` (the job runs with 1 or 2 nodes), the rendezvous at
# 127.0.0.1 (node A, started first, hosts it), `--max-restarts=3`, and rendezvous settings for a lesson's
# clock: `last_call_timeout=1` (once MIN nodes are there, wait 1 s, not 30, for more), `join_timeout=60`, and
# a heartbeat every second, a node being dead after 5 missed ones (`keep_alive_interval=1`,
# `keep_alive_max_attempt=5`; the defaults, 5 s and 3, make the next round wait 15 s for a lost node).
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives each round a fresh store for `init_process_group` (lesson 13,
# §1: a restarted group must not read the previous group's addresses; a membership change does not change
# `TORCHELASTIC_RESTART_COUNT`, so lesson 13's prefix per attempt would not be enough here).

# %% start-nodes-code
import json, signal, socket, subprocess, sys, time
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
options = ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lesson-18", "--start-method=forkserver",
           "--rdzv-conf=last_call_timeout=1,join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=5"]
env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="INFO")
nodes = {name: subprocess.Popen([sys.executable, "runs/18/node.py", *options, out_dir, "1000"],
                                env=dict(env, NODE_NAME=name), stdout=open(f"{out_dir}/{name}.log", "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
         for name in "AB"}
print("nodes A and B started, pids", {name: p.pid for name, p in nodes.items()})

# %% run-job [markdown]
# ## 3 · A alone, then B joins, then B dies
# The lesson reads the ranks' lines as they come: A starts; after 3 steps B joins; after 3 steps of both,
# B's agent and worker are killed (SIGKILL: a node lost); after 3 more steps of A alone, the job is told
# to stop. Every wait has a deadline.

# %% run-job-code
def records():
    try:
        return [json.loads(line) for line in open(f"{out_dir}/log.jsonl")]
    except FileNotFoundError:
        return []

def wait_for(what, name, seconds=60):
    deadline = time.monotonic() + seconds
    while not what(records()):
        assert time.monotonic() < deadline, f"no {name} within {seconds} s; see {out_dir}/A.log and B.log"
        assert nodes["A"].poll() is None, f"node A ended early; see {out_dir}/A.log"
        time.sleep(0.05)

start = time.monotonic()
try:
    open(f"{out_dir}/A.go", "w").close()
    wait_for(lambda rs: sum(r["world"] == 1 for r in rs) >= 3, "3 steps of A alone")
    open(f"{out_dir}/B.go", "w").close()
    wait_for(lambda rs: sum(r["world"] == 2 and r["rank"] == 0 for r in rs) >= 3, "3 steps of A and B")
    os.killpg(nodes["B"].pid, signal.SIGKILL); nodes["B"].wait()
    wait_for(lambda rs: sum(r["restart"] == 1 for r in rs) >= 3, "3 steps after B was lost")
    open(f"{out_dir}/stop", "w").close()
    node_a_exit = nodes["A"].wait(timeout=60)
finally:
    for p in nodes.values():           # a node's agent, its forkserver and workers: one process group
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:     # all of them ended already
            pass
        p.wait()
print(f"node A exited with {node_a_exit} after {time.monotonic() - start:.0f} s")
agent_says = [line.split("] ", 1)[1].strip() for line in open(f"{out_dir}/A.log")
              if "will restart worker group" in line]
print("node A's agent:", *agent_says, sep="\n  ")

# %% what-ranks-saw [markdown]
# ## 4 · What the ranks saw
# One row per worker process (a group start), from the ranks' own lines:

# %% what-ranks-saw-code
records_seen = records()
starts = {}
for r in records_seen:
    starts.setdefault(r["pid"], {**r, "first": r["step"]})["last"] = r["step"]
phases = []
for s in starts.values():
    print(f"pid {s['pid']}: node {s['node']} rank {s['rank']} of WORLD_SIZE {s['world']}, "
          f"TORCHELASTIC_RESTART_COUNT {s['restart']}, steps {s['first']}..{s['last']}")
    if s["rank"] == 0:
        phases.append((s["world"], s["restart"], s["first"], s["last"]))
print("the job, as rank 0 saw it: (WORLD_SIZE, restart count, first step, last step)", phases)

# %% timeline [markdown]
# The same lines on a clock: each dot is a step a rank reported, one colour per worker group. Between the
# groups the job **pauses**: the old group is stopped (or dies), the agents meet again, and the new group
# starts and loads the checkpoint. That pause, not a lost step, is what a membership change costs. Losing a
# node costs more than gaining one: the survivor first fails on its dead peer, and the next round waits
# until the lost node has missed its heartbeats (5 of 1 s here).

# %% timeline-code
import matplotlib.pyplot as plt
t0 = min(r["t"] for r in records_seen)
fig, ax = plt.subplots(figsize=(9, 2.4))
pauses = []
for i, (world, restart, first, last) in enumerate(phases):
    mine = [r for r in records_seen if (r["world"], r["restart"]) == (world, restart)]
    ax.plot([r["t"] - t0 for r in mine], [r["rank"] for r in mine], "o", ms=3, color=f"C{i}",
            label=f"group {i + 1}: WORLD_SIZE {world}, restart count {restart}")
    if i:
        pauses.append(min(r["t"] for r in mine) - max(r["t"] for r in records_seen
                                                      if (r["world"], r["restart"]) == phases[i - 1][:2]))
ax.set_yticks(range(world_size)); ax.set_ylabel("rank"); ax.set_xlabel("seconds since the first step")
ax.set_ylim(-0.5, world_size - 0.5); ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
ax.set_title("steps as the ranks reported them: A alone, A and B, A alone again")
fig.tight_layout(); plt.show()
print("pauses between the groups:", [f"{p:.1f} s" for p in pauses], "(a step takes about 0.1 s)")
assert len(pauses) == 2 and all(p > 0.3 for p in pauses) and pauses[1] > pauses[0], pauses

# %% same-as-fixed [markdown]
# Each new group began with the step after the last checkpoint (a step cut off before its checkpoint is done
# again; one checkpointed just before the kill, but not yet logged, is not),
# and the world size changed twice. Did the changes change the **training**? The same `train`, as a fixed
# job of 2 ranks that never changes (plain `%%ddp`), for as many steps as the elastic job took, must end
# with the same weights: each step's gradient is the mean over the same 8 rows, whoever computed it.

# %% same-as-fixed-code
import torch
final = torch.load(f"{out_dir}/ckpt.pt")
steps_done = final["step"]
os.makedirs(f"{out_dir}/fixed", exist_ok=True)

# %% same-as-fixed-ddp
# %%ddp -n $world_size --timeout 60 --push out_dir,steps_done
import sys
sys.path.insert(0, "runs/18")
from node import train
train(f"{out_dir}/fixed", steps_done)

# %% same-as-fixed-compare
fixed = torch.load(f"{out_dir}/fixed/ckpt.pt")
gap = max((final["model"][k] - fixed["model"][k]).abs().max().item() for k in final["model"])
print(f"after {steps_done} steps: elastic job's weight {final['model']['weight'].flatten().tolist()}")
print(f"              fixed 2-rank job's weight {fixed['model']['weight'].flatten().tolist()}  (largest gap {gap:.1e})")

# %% check [markdown]
# ## Check

# %% check-code
assert node_a_exit == 0, f"node A exited with {node_a_exit}"
assert [p[:2] for p in phases] == [(1, 0), (2, 0), (1, 1)], phases          # A alone; A+B; A alone again
assert all(a[3] < b[2] <= a[3] + 2 for a, b in zip(phases, phases[1:])), phases  # resumed at the checkpoint
assert len(agent_says) == 2 and "new nodes" in agent_says[0] and "FAILED" in agent_says[1], agent_says
assert {s["node"] for s in starts.values() if s["world"] == 2} == {"0", "1"}, starts     # two nodes in the middle
assert fixed["step"] == steps_done and gap < 1e-5, (gap, steps_done)       # the training did not change
print("ok: WORLD_SIZE 1 -> 2 -> 1, restart count 0 -> 0 -> 1, the whole group restarted each time, "
      "training resumed from the checkpoint and ended where a fixed job ends")

# %% torchft [markdown]
# ## 5 · Beyond restarts: per-step fault tolerance (torchft, a reading)
# Every change above cost a **restart of the whole group**: new processes, a new rendezvous, the model and
# optimizer loaded again from storage, and the steps since the last checkpoint done again. On thousands of
# GPUs, where some node fails every few hours, that is a large share of the time. **torchft**
# (`github.com/meta-pytorch/torchft`, installed separately, not part of torch 2.13, not run here) keeps the
# processes alive instead:
#
# - the job is split into **replica groups** (each one a full copy of the model, possibly sharded with FSDP
#   inside it); data parallelism runs **across** the groups;
# - a central **Lighthouse** and a **Manager** in each group agree on a **quorum** every step: which groups
#   take part in this step (at least `min_replica_size`);
# - a group that fails drops out of the quorum and the others **go on at the next step** with fewer replicas:
#   the process groups across replicas are reconfigured, not restarted, and a step whose all-reduce failed is
#   not committed (the optimizer wrapper asks the Manager whether to commit);
# - a group that comes back (or a new one) **heals**: it fetches the current weights and optimizer state
#   from a live peer, not from a checkpoint on disk, and joins the quorum at the next step.
#
# The price: the global batch of a step depends on how many groups were in its quorum, and the training code
# goes through torchft's wrappers (`torchft.Manager`, its DDP and optimizer wrappers). Restarts, as in this
# lesson, remain what torchrun itself offers.

# %% exercise [markdown]
# ## Exercise
# The job ran with `--max-restarts=3`. From `records_seen` (the ranks' lines), compute `restarts_used`: how
# many of those 3 restarts torchrun spent, and `group_starts`: how many times a worker group was started
# in all (rank 0's process ids tell the groups apart).
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your answers here:
#   restarts_used = ...   # how many of --max-restarts=3 the job used
#   group_starts = ...    # how many worker groups were started, in all

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-code tags=["solution"]
restarts_used = max(r["restart"] for r in records_seen)              # TORCHELASTIC_RESTART_COUNT at the end
group_starts = len({r["pid"] for r in records_seen if r["rank"] == 0})
print(f"{group_starts} groups started; {restarts_used} of 3 restarts used; {3 - restarts_used} left")

# %% solution-note [markdown] tags=["solution"]
# Three groups started, but only the loss of node B counted: B joining restarted the group as well, yet
# `TORCHELASTIC_RESTART_COUNT` stayed 0. The job could still lose a node twice more; a node joining (up to
# `--nnodes`'s 2) costs none.

# %% check-answer tags=["check"]
assert "restarts_used" in globals() and "group_starts" in globals(), "✗ nothing to check yet: set restarts_used and group_starts"
assert group_starts == 3, f"✗ group_starts = {group_starts!r}: count rank 0's distinct process ids (A alone, A+B, A alone again)"
assert restarts_used != 2, "✗ restarts_used = 2: a node joining restarts the group but is no failure, so torchrun does not count it (TORCHELASTIC_RESTART_COUNT stayed 0)"
assert restarts_used == 1, f"✗ restarts_used = {restarts_used!r}: read the restart count the ranks reported"
print(f"✓ {group_starts} worker groups, {restarts_used} restart used: only the lost node counted")

# %% mistake tags=["mistake"]
group_starts = len({r["pid"] for r in records_seen if r["rank"] == 0})
restarts_used = group_starts - 1          # "every new group is a restart"
# expect: ✗ restarts_used = 2: a node joining
