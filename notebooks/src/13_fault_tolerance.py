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
# The process group is set up differently from lesson 04, in two statements: the script opens the
# launcher's own store (`dist.TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)`), and
# `init_process_group` gets it under a **prefix per attempt** (`dist.PrefixStore`). That works around
# torch bugs. torchrun keeps one TCP store for the whole job (a static `--master-port` always did;
# `--standalone` and `--rdzv-backend c10d` share the rendezvous store with the ranks since mid-2024,
# pytorch#128096), and `init_process_group` writes its keys (each rank's gloo
# address, NCCL's unique id) under the same names in every attempt, so a restarted group can read the dead
# attempt's values (pytorch#135712, #167288). A restarted plain `init_process_group("gloo")` is then a race
# with three outcomes, all three seen on this machine under plain torchrun (and `%%ddp --launcher torchrun`
# runs the same torchrun, so it meets the same race): it works; it fails at once (`Gloo connectFullMesh
# failed … Connection refused`: a rank dialled the dead attempt's address); or both ranks wait in gloo's
# connect for each other until `init_process_group`'s timeout (30 minutes for gloo). NCCL meets the same: a restarted rank can read
# the dead attempt's unique id and dial its port (#135712). Without nbddp, a torchrun user with
# `--standalone` or c10d can set `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in torchrun's environment: rank 0
# then hosts a fresh store in every attempt (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py;
# `TORCHELASTIC_USE_AGENT_STORE` becomes `False`). A static `--master-port` has no such switch; a prefix
# per attempt, as below, works under both. First a clean folder:

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
# The script §2 exported, run as `python runs/13/train.py runs/13/clean 4 -1` would run it:

# %% same-script-without-failure-ddp
# %%ddp -n $world_size --timeout 60 --output text -- runs/13/clean $epochs -1
import runpy
_ = runpy.run_path("runs/13/train.py", run_name="__main__")   # the same file, sys.argv as given above

# %% same-script-without-failure-code
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

# %% without-restarts [markdown]
# ## 4 · Without `--max-restarts`
# torchrun restarts nothing by default: the same failing job, into `runs/13/no_restart`.

# %% without-restarts-code
import nbddp
try:
    get_ipython().run_cell_magic(
        "ddp", f"-n {world_size} --launcher torchrun --timeout 150 -- runs/13/no_restart {epochs} {kill_in_epoch}", train)
    raise AssertionError("expected the job to fail")
except nbddp.DDPError as exc:
    no_restart = exc.result
for r in no_restart.ranks:
    print(f"rank {r.rank}: {r.state}, exit code {r.exitcode}: {r.describe()[:150]}")

# %% without-restarts-code-2
by_rank = {r.rank: r for r in no_restart.ranks}
assert (by_rank[1].state, by_rank[1].exitcode) == ("killed", -9), by_rank[1].describe()
assert by_rank[0].state in ("failed", "terminated"), by_rank[0].describe()
assert no_restart.ended_at - by_rank[1].ended_at < 20, "at once: seconds after the kill, not --timeout's 150"
if by_rank[0].state == "failed":   # its all-reduce saw the lost peer before torchrun's SIGTERM came
    assert "by peer" in by_rank[0].cause and by_rank[0].hint.startswith("another rank ended"), by_rank[0]

# %% without-restarts-note [markdown]
# The job ends at once. The rank that **survived** either raised in its next all-reduce (gloo's
# `Connection closed by peer` or `reset by peer`, with the one-line hint "another rank ended") or was
# stopped by torchrun's fail-fast (SIGTERM), whichever came first: a symptom either way. The cause is the
# rank that ended first, by SIGKILL, its last line "killed on purpose". Beware of torchrun's own summary:
# its "Root Cause (first observed failure)" is the failure with the earliest timestamp in whole seconds
# (torch/distributed/elastic/multiprocessing/api.py, errors/__init__.py), and a rank killed by a signal gets
# the second torchrun noticed it, so the survivor's error, written a moment later, can be named instead.

# %% exercise [markdown]
# ## Exercise
# From the run without restarts: which rank's end **caused** the failure (`culprit`), and with which epoch
# would a rerun of the same command start (`resume_at`)? Read `no_restart` and the snapshot
# (`torch.load("runs/13/no_restart/snapshot.pt")`).
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your answers here:
#   culprit = ...     # the rank whose end caused the failure
#   resume_at = ...   # the epoch a rerun starts with

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-code tags=["solution"]
culprit = next(r.rank for r in no_restart.ranks if r.state == "killed")   # ended first, by SIGKILL
resume_at = torch.load("runs/13/no_restart/snapshot.pt")["epoch"]        # saved after epoch 1: "epoch": 2
print(f"rank {culprit} caused it; a rerun resumes with epoch {resume_at}")

# %% solution-note [markdown] tags=["solution"]
# Rank 1 ended first (SIGKILL); rank 0 only lost its peer, or was stopped. The snapshot holds the state
# *after* epoch 1 and says `"epoch": 2`: the epoch a rerun starts with, the same as torchrun's restart did.

# %% check-answer tags=["check"]
assert "culprit" in globals() and "resume_at" in globals(), "✗ nothing to check yet: set culprit and resume_at"
assert culprit != 0, "✗ rank 0 did not cause it: it lost its peer in an all-reduce (or torchrun stopped it); which rank ended first?"
assert culprit == 1, f"✗ culprit = {culprit!r}: the rank whose process died first (its state in no_restart is 'killed')"
saved = torch.load("runs/13/no_restart/snapshot.pt")["epoch"]
assert resume_at != saved - 1, f"✗ resume_at = {resume_at}: epoch {saved - 1} is the last one saved; the snapshot holds the state after it"
assert resume_at == saved == kill_in_epoch, f"✗ resume_at = {resume_at!r}: the snapshot says epoch {saved}"
print(f"✓ rank {culprit} caused it (SIGKILL); rank 0 only lost its peer; a rerun resumes with epoch {resume_at}")

# %% mistake-torchruns-root-cause tags=["mistake"]
culprit = 0       # the rank with the error message (torchrun's "Root Cause" can name it)
resume_at = 2
# expect: ✗ rank 0 did not cause it

# %% mistake-last-saved tags=["mistake"]
culprit = 1
resume_at = torch.load("runs/13/no_restart/snapshot.pt")["epoch"] - 1   # "the last epoch saved"
# expect: ✗ resume_at = 1: epoch 1 is the last one saved
