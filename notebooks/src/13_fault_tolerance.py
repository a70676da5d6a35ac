# %% title [markdown]
# # 13 · Fault tolerance: snapshots and `torchrun --max-restarts` (容错训练)
#
# A rank dies — a node reboots, a GPU falls off the bus, the OOM killer strikes. Plain DDP cannot lose a
# member: the other ranks are stopped (torchrun is fail-fast) and the job is over. torchrun can instead
# **restart the whole group** (`--max-restarts K`): every rank starts again from the first line of the
# script, with `TORCHELASTIC_RESTART_COUNT` counting the attempts. What the ranks knew is gone, so training
# resumes only if the script saves a **snapshot** (model, optimizer, epoch) and loads it when it starts.
#
# Below, rank 1 is **killed on purpose** (SIGKILL) halfway through an epoch on the first attempt. torchrun
# (`%%ddp --launcher torchrun --max-restarts 1`) stops rank 0 and starts both again; they load the snapshot
# and finish. The result is then compared with the same training without a failure.

# %% parameters tags=["parameters"]
world_size = 2
epochs = 4
kill_in_epoch = 2

# %% load-ext
# %load_ext nbddp

# %% training-script-snapshot-after [markdown]
# ## 1 · The training script: a snapshot after every epoch, loaded at start
# Under torchrun the ranks are torchrun's own processes, so `--pull` cannot reach them: rank 0 writes what
# the check needs to `history.jsonl`, as a real job writes its logs. Arguments: output folder, epochs, and
# the epoch in which rank 1 dies on the first attempt (`-1`: never).
#
# One line differs from lesson 04: `init_process_group` gets the launcher's store under a **prefix per
# attempt**. torchrun keeps one store for the whole job, and torch 2.13 does not separate the attempts in
# it: a restarted group that calls plain `init_process_group("gloo")` reads the dead attempt's addresses
# (`Gloo connectFullMesh failed … Connection refused` under plain torchrun here, a hang in
# `init_process_group` under `%%ddp --launcher torchrun`). First a clean folder:

# %% training-script-snapshot-after-code
import json, os, shutil, torch
shutil.rmtree("runs/13", ignore_errors=True); os.makedirs("runs/13")

# %% under-torchrun-rank-killed [markdown]
# ## 2 · Under torchrun, with a rank killed and one restart allowed
# `--export runs/13/train.py` also saves the cell as a script, for the comparison run below.

# %% under-torchrun-rank-killed-ddp
# %%ddp -n $world_size --launcher torchrun --max-restarts 1 --timeout 150 --export runs/13/train.py -- runs/13/failing $epochs $kill_in_epoch
import json, os, signal, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
out, epochs, kill_in_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])       # 0, then 1 after a restart
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)  # the launcher's
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),  # a namespace per attempt
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank, world = dist.get_rank(), dist.get_world_size()
os.makedirs(out, exist_ok=True)
snapshot = f"{out}/snapshot.pt"

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
start = 0
if os.path.exists(snapshot):                                   # a restart: continue where it left off
    state = torch.load(snapshot)
    model.module.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"]); start = state["epoch"]
    print(f"attempt {attempt}: resumed from the snapshot taken after epoch {start - 1}")

for epoch in range(start, epochs):
    g = torch.Generator().manual_seed(1000 * epoch + rank)     # an epoch's data, whatever the attempt
    total = torch.zeros(1)
    for step in range(8):
        x = torch.randn(32, 8, generator=g); y = x.sum(1, keepdim=True).sin()
        if attempt == 0 and epoch == kill_in_epoch and step == 4 and rank == 1:
            print("killed on purpose (SIGKILL), halfway through epoch", epoch, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(x), y); loss.backward(); opt.step()
        total += loss.detach()
    dist.all_reduce(total)
    if rank == 0:
        mean = total.item() / (8 * world)
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1},
                   snapshot + ".tmp")
        os.replace(snapshot + ".tmp", snapshot)                   # never a half-written snapshot
        with open(f"{out}/history.jsonl", "a") as f:
            f.write(json.dumps({"attempt": attempt, "epoch": epoch, "loss": mean}) + "\n")
        print(f"attempt {attempt}, epoch {epoch}: loss {mean:.5f}, snapshot saved")
    dist.barrier()                                                # nobody races ahead of the snapshot
dist.destroy_process_group()

# %% under-torchrun-rank-killed-code
failing = _ddp
train = open("runs/13/train.py").read()
history = [json.loads(line) for line in open("runs/13/failing/history.jsonl")]
for h in history:
    print(h)

# %% same-script-without-failure [markdown]
# ## 3 · The same script without a failure (plain `%%ddp`, no kill)

# %% same-script-without-failure-ddp
get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60 --output text -- runs/13/clean {epochs} -1", train)
clean = [json.loads(line) for line in open("runs/13/clean/history.jsonl")]

# %% check [markdown]
# ## Check

# %% check-code
assert failing.ok and any("restarted by torchrun" in note for note in failing.notes), failing.notes
assert [(h["attempt"], h["epoch"]) for h in history] == (
    [(0, e) for e in range(kill_in_epoch)] + [(1, e) for e in range(kill_in_epoch, epochs)]), history
assert [(h["attempt"], h["epoch"]) for h in clean] == [(0, e) for e in range(epochs)], clean
assert max(abs(a["loss"] - b["loss"]) for a, b in zip(history, clean)) < 1e-6, (history, clean)
resumed, uninterrupted = torch.load("runs/13/failing/snapshot.pt"), torch.load("runs/13/clean/snapshot.pt")
assert all(torch.allclose(resumed["model"][k], uninterrupted["model"][k], atol=1e-6) for k in resumed["model"])
print(f"ok: killed in epoch {kill_in_epoch}, restarted by torchrun, resumed from the snapshot; the final model "
      "equals the one trained without a failure (only the half epoch was done twice)")

# %% exercise [markdown]
# ## Exercise
# Without `--max-restarts` torchrun does not restart anything. Run the failing job so (into
# `runs/13/no_restart`): how does the cell end, which state does `_ddp` give rank 1, and from which epoch
# could a manual rerun resume?
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your run here, for example
#   try:
#       get_ipython().run_cell_magic("ddp", f"-n {world_size} --launcher torchrun --timeout 150 -- runs/13/no_restart {epochs} {kill_in_epoch}", train)
#   except nbddp.DDPError as exc:
#       no_restart = exc.result

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
import nbddp
try:
    get_ipython().run_cell_magic(
        "ddp", f"-n {world_size} --launcher torchrun --timeout 150 -- runs/13/no_restart {epochs} {kill_in_epoch}", train)
    raise AssertionError("expected the job to fail")
except nbddp.DDPError as exc:
    no_restart = exc.result
left = torch.load("runs/13/no_restart/snapshot.pt")["epoch"]
for r in no_restart.ranks:
    print(f"exit code {r.exitcode}: {r.describe()[:160]}")
print("a rerun would resume at epoch", left)

# %% solution-note [markdown] tags=["solution"]
# The job ends at once. The rank that **survived** either reports an error (`Connection closed` or `reset by
# peer`) — when its next all-reduce noticed the lost peer before torchrun's agent did — or was stopped by
# torchrun (SIGTERM), whichever came first; both are
# symptoms, not the cause. The cause is in the log of the rank whose process died (`SIGKILL`, and its last
# line, "killed on purpose"). The snapshot of epoch 1 is still there: rerunning the cell would resume at
# epoch 2, the same as torchrun's restart did.

# %% check-answer tags=["check"]
assert "no_restart" in globals(), "✗ nothing to check yet: keep the failed run's result as `no_restart` (exc.result)"
assert no_restart.ranks[1].exitcode == -9, f"✗ rank 1 exited with {no_restart.ranks[1].exitcode}, not -9 (SIGKILL): run the failing job, without --max-restarts"
survivor = no_restart.ranks[0].describe()
assert "by peer" in survivor or "stopped by torchrun" in survivor, f"✗ rank 0 should report its lost peer (closed / reset by peer) or that torchrun stopped it: {survivor[:120]}"
left = torch.load("runs/13/no_restart/snapshot.pt")["epoch"]
assert left == kill_in_epoch, f"✗ the snapshot says epoch {left}: the run into runs/13/no_restart should have saved {kill_in_epoch} epochs"
print(f"✓ no restart: rank 1 was killed (-9), rank 0 {'lost its peer' if 'by peer' in survivor else 'was stopped by torchrun'}, "
      f"and a rerun would resume at epoch {left}")
