# %% title [markdown]
# # 06 · Pitfalls, reproduced (常见错误复现)
#
# Mistakes everybody makes once. Each is reproduced on purpose here, caught, and checked, so you recognise
# the message when it happens for real — first as plain torch reports it (a subprocess with plain `python`,
# or the cell under real torchrun), then as `%%ddp` does, which stops some of them earlier.

# %% parameters tags=["parameters"]
world_size = 2
hang_timeout = 5

# %% load-ext
# %load_ext nbddp

# %% env-without-launcher-master_addr [markdown]
# ## 1 · `env://` without a launcher: `RANK expected, but not set`
# `init_process_group` with the default `env://` reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`.
# Run the script with plain `python` (here: a subprocess, not under nbddp) and they are missing.
#
# > **Not the articles' line.** Articles quote `environment variable MASTER_ADDR expected, but not set` as
# > what a script started with plain `python` prints. Torch never prints that there: `env://` reads `RANK`
# > first, then `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (torch/distributed/rendezvous.py), so torch 2.13
# > says `ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable
# > RANK expected, but not set`. The `MASTER_ADDR` line comes only once rank and world size are given
# > (as `rank=`/`world_size=` or as variables): the half-fix below, run for real.

# %% env-without-launcher-master_addr-code
import os, subprocess, sys
os.makedirs("runs/06", exist_ok=True)
clean = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
script = "import torch.distributed as dist\ndist.init_process_group('gloo', init_method='env://')"
plain = subprocess.run([sys.executable, "-c", script], env=clean, capture_output=True, text=True)
print("exit code", plain.returncode, "|", plain.stderr.strip().splitlines()[-1])
# the usual half-fix: rank and world size set by hand, the meeting point forgotten
half = subprocess.run([sys.executable, "-c", script], env=dict(clean, RANK="0", WORLD_SIZE="1"),
                      capture_output=True, text=True)
print("exit code", half.returncode, "|", half.stderr.strip().splitlines()[-1])

# %% env-without-launcher-master_addr-code-2
assert plain.returncode != 0 and plain.stderr.strip().splitlines()[-1] == (
    "ValueError: Error initializing torch.distributed using env:// rendezvous: "
    "environment variable RANK expected, but not set")
assert "MASTER_ADDR expected" not in plain.stderr          # the articles' line is not what plain python gets
assert "environment variable MASTER_ADDR expected, but not set" in half.stderr

# %% env-without-launcher-master_addr-note [markdown]
# **Fix**: start it with `torchrun` (or `%%ddp`), which sets all four; or set them yourself.

# %% collective-inside-if-rank [markdown]
# ## 2 · A collective inside `if rank == 0:` — the hang
# A collective must be called by **every** rank. Below only rank 0 calls `all_reduce`; rank 1 goes on to the
# `barrier`. Neither can finish: a hang, with no error message at all until the group's timeout runs out
# (`init_process_group`'s `timeout`: by default 30 minutes with gloo, `default_pg_timeout`). `--timeout` stops it and shows
# **where each rank is blocked** (nbddp asks each rank for its Python stack before stopping it).

# %% collective-inside-if-rank-ddp
import nbddp
hang = '''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
if rank == 0:
    dist.all_reduce(t)          # only rank 0 gets here
dist.barrier()                  # the others wait here, forever
'''
try:
    get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout {hang_timeout}", hang)
    raise AssertionError("expected a timeout")
except nbddp.DDPTimeout as exc:
    timed_out = exc.result
for r in timed_out.ranks:
    print(f"rank {r.rank}: {r.state}; blocked at {r.blocked_at}")
print(timed_out.notes[-1])

# %% collective-inside-if-rank-code
assert timed_out.timed_out and all(r.state == "timed out" for r in timed_out.ranks)
assert "all_reduce" in timed_out.ranks[0].blocked_at
if world_size > 1:
    assert "barrier" in timed_out.ranks[1].blocked_at
    assert "not all in the same collective" in timed_out.notes[-1]
assert "all_reduce" in timed_out.ranks[0].stack          # the full Python stack of the rank

# %% collective-inside-if-rank-note [markdown]
# **Fix**: every rank calls the collective; only the *use* of the result is rank-dependent:
# `dist.all_reduce(t)` then `if rank == 0: print(t)`.
#
# ## 3 · Port conflict: `MASTER_PORT` already taken
# Another job (or a crashed one) still holds the port — most often torch's **default, 29500**: `torchrun`
# with `--nnodes` > 1 and no `--master-port` uses it, and so do the articles' examples, so two such jobs on
# one machine collide. What torch itself does: rank 0 tries to host the store on that port and fails with
# `EADDRINUSE` (run for real below, plain `python`, no nbddp). `%%ddp` checks the port before starting
# anything and says so in one line.

# %% collective-inside-if-rank-ddp-2
import socket
from IPython.core.error import UsageError
holder = socket.socket(); holder.bind(("127.0.0.1", 0)); holder.listen()
busy_port = holder.getsockname()[1]
env = dict(clean, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy_port))
torch_itself = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
print("plain torch: exit code", torch_itself.returncode, "|", torch_itself.stderr.strip().splitlines()[-1].split("Error: ")[-1])
try:
    get_ipython().run_cell_magic("ddp", f"-n {world_size} --master-port {busy_port} --timeout 60", "print('never runs')")
    raise AssertionError("expected a UsageError")
except UsageError as exc:
    port_error = str(exc)
finally:
    holder.close()
print(port_error)

# %% collective-inside-if-rank-code-2
assert torch_itself.returncode != 0 and "EADDRINUSE" in torch_itself.stderr
assert f"MASTER_PORT {busy_port} is already in use" in port_error

# %% collective-inside-if-rank-note-2 [markdown]
# **Fix**: pick another port, or leave `--master-port` out where something picks a free one: `%%ddp` does so
# per launch, and so do torchrun's `--standalone` and `--rdzv-backend c10d --rdzv-endpoint localhost:0` (both
# parts: with the endpoint alone the backend stays `static`, which hands the literal port 0 to the ranks as
# `MASTER_PORT`, and `init_process_group` hangs). Plain `torchrun --nnodes 1`
# without a port does so by itself only since torch 2.12 (torch/distributed/run.py turns such a static run
# into c10d at `localhost:0`, pytorch#175699); 2.11 and older (this project allows torch>=2.3) use 29500
# there too, so two such jobs on one machine collide. Lesson 02 shows both.
#
# ## 4 · A multi-node configuration that does not add up
# `%%ddp` runs the same number of ranks on every simulated node, so its `-n` must be `nnodes × nproc_per_node`:
# 4 processes cannot be spread evenly over 3 nodes, and asking for 4 ranks while saying 3 per node on 2 nodes
# (= 6) contradicts itself.

# %% collective-inside-if-rank-ddp-3
config_errors = {}
for line in ("-n 4 --nnodes 3", "-n 4 --nproc-per-node 3 --nnodes 2"):
    try:
        get_ipython().run_cell_magic("ddp", line + " --timeout 60", "print('never runs')")
    except UsageError as exc:
        config_errors[line] = str(exc)
        print(f"%%ddp {line}\n    -> {exc}")

# %% uneven-nodes [markdown]
# torchrun itself does not require the same count on every node: each node's agent starts its own
# `--nproc-per-node`, and `WORLD_SIZE` is their sum, the ranks numbered by a running sum over the nodes
# (`_assign_worker_ranks` in torch/distributed/elastic/agent/server/api.py; the `nnodes × nproc_per_node`
# shortcut is taken only with `TORCH_ELASTIC_WORKER_IDENTICAL=1`). Two real torchrun agents on this machine,
# `--nnodes 2`, node 0 with `--nproc-per-node 2` and node 1 with 1 (each rank only prints its variables, in
# one `os.write`: the ranks of a node share torchrun's stdout, and a `print` that reaches it in pieces, as
# under `PYTHONUNBUFFERED`, can be cut by another rank's line, `RANKRANK 0 …`):

# %% uneven-nodes-code
with open("runs/06/who.py", "w") as f:
    f.write("import os\n"  # one write: a node's ranks share torchrun's stdout, and a print in pieces is cut
            "os.write(1, f\"RANK {os.environ['RANK']} WORLD_SIZE {os.environ['WORLD_SIZE']}\\n\".encode())\n")
free = socket.socket(); free.bind(("127.0.0.1", 0)); uneven_port = free.getsockname()[1]; free.close()
agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                            "--nproc-per-node", str(n), "--master-addr", "127.0.0.1", "--master-port", str(uneven_port),
                            "runs/06/who.py"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean)
          for i, n in enumerate((2, 1))]
uneven = [(a.communicate(timeout=120)[0], a.returncode) for a in agents]
for i, (out, code) in enumerate(uneven):
    print(f"node {i}: exit code {code}:", sorted(line for line in out.splitlines() if line.startswith("RANK")))

# %% uneven-nodes-check
assert [code for _, code in uneven] == [0, 0], uneven
assert sorted(line for out, _ in uneven for line in out.splitlines() if line.startswith("RANK")) == [
    f"RANK {r} WORLD_SIZE 3" for r in range(3)], uneven           # 2 + 1 ranks, WORLD_SIZE 3

# %% collective-inside-if-rank-note-3 [markdown]
# With real machines, a count that does not match does not fail fast. Node 0 says `--nnodes 2` and node 1 is
# never started (or node 0 claims more nodes than are started): node 0 **waits at the rendezvous** for agents
# that never come. Its agent waits and starts no rank: 900 s with the static rendezvous of `--master-addr`/`--master-port`
# (torchrun gives it no timeout, so `LaunchConfig`'s default of 900 s applies, torch/distributed/launcher/api.py;
# the rendezvous's own 600 s default is for callers that give none), 600 s with c10d (`--rdzv-backend c10d`,
# `--standalone`: its `join_timeout`, dynamic_rendezvous.py). `--rdzv-conf timeout=…` and `join_timeout=…`
# change them. The other way round, node 1 saying `--nnodes 3` while node 0 says 2, the static rendezvous does
# not notice: node 0 hosts the store sized by its own `--nnodes` (static_tcp_rendezvous.py), node 1 only
# connects, and both agents start their ranks (node 1's see `WORLD_SIZE` 2 but `GROUP_WORLD_SIZE` 3). The
# mismatch can show at the end: each agent's exit barrier counts up to its own number of nodes, so when node 1
# is the last to arrive nobody completes it, and both agents wait out its 300 s (`exit_barrier_timeout`,
# agent/server/api.py) before they log `Error waiting on exit barrier` and exit. Thirty minutes is another default:
# `init_process_group`'s timeout with gloo (`default_pg_timeout`; NCCL's `default_pg_nccl_timeout` is 10
# minutes, torch/distributed/constants.py), how long a plain script's rank waits there for the others. Here
# is that rank alone (plain `python`, rank 0 of a world of 2), told to wait 3 s instead (its message may
# name a second more, "Timed out after 4 seconds"; the check below accepts 3 s or more):

# %% collective-inside-if-rank-code-3
lonely = '''
import datetime, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
'''
env = dict(clean, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy_port))
alone = subprocess.run([sys.executable, "-c", lonely], env=env, capture_output=True, text=True, timeout=60)
print("exit code", alone.returncode, "|", alone.stderr.strip().splitlines()[-1][:300])

# %% collective-inside-if-rank-code-4
import datetime, re, torch.distributed.constants as constants
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from torch.distributed.launcher.api import LaunchConfig
waited = re.search(r"Timed out after (\d+) seconds waiting for clients\. 1/2 clients joined", alone.stderr)
assert waited and int(waited[1]) >= 3, alone.stderr[-500:]   # torch says how long it waited, 3 s or a little more
assert constants.default_pg_timeout == datetime.timedelta(minutes=30)                   # gloo's
assert dynamic_rendezvous.RendezvousTimeout._DEFAULT_TIMEOUTS["join"] == datetime.timedelta(seconds=600)  # c10d
# what torchrun's static rendezvous gets: run.py builds a LaunchConfig with no timeout of its own
assert LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1).rdzv_configs["timeout"] == 900

# %% tutorial-s-own-setup [markdown]
# ## 5 · A tutorial's own `setup()`: hangs under torchrun, runs under `%%ddp`
# PyTorch's DDP tutorial starts each process with its own meeting point and numbers:
# `os.environ["MASTER_PORT"] = "12355"` then `init_process_group("gloo", rank=rank, world_size=world_size)`
# (or `init_method="tcp://127.0.0.1:12355"`). Under `torchrun --standalone` that code **hangs**: torchrun tells
# its ranks `TORCHELASTIC_USE_AGENT_STORE=True` ("the launcher hosts the store"), so rank 0 too waits as a
# client on a port no one serves. `%%ddp` sets the same variable, but uses its own store only when the cell
# aims at it; aimed elsewhere, rank 0 hosts the store as in a plain script, and the cell runs. The same holds
# in processes a rank starts with `mp.spawn` (the tutorial's whole script in a `%%ddp -n 1` cell runs).
#
# The tutorial's code as a script; its port and its world size come from the command line, so each run
# below runs this very file (the tutorial writes `"12355"`, which may be taken on a shared machine):

# %% tutorial-s-own-setup-script
# %%writefile runs/06/tutorial.py
import os, sys, torch, torch.distributed as dist

def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = sys.argv[1]          # the tutorial's "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

print(f"rank {os.environ['RANK']} joins a group of {sys.argv[2]}", flush=True)
setup(int(os.environ["RANK"]), int(sys.argv[2]))   # the tutorial passes its world_size
t = torch.ones(1); dist.all_reduce(t)
print("all_reduce over the tutorial's own rendezvous:", t.item())
dist.destroy_process_group()

# %% tutorial-s-own-setup-note-0 [markdown]
# First, what torch itself does: the script under real torchrun (`--launcher torchrun`), stopped by `--timeout`.

# %% tutorial-s-own-setup-ddp
tutorial = open("runs/06/tutorial.py").read()  # the file above, run as the cell
reserved = socket.socket()                     # a port for the tutorial's store, held (not listening) so
reserved.bind(("127.0.0.1", 0)); tutorial_port = reserved.getsockname()[1]   # torchrun's own store
try:                                           # cannot be handed the same number
    get_ipython().run_cell_magic(
        "ddp", f"-n {world_size} --launcher torchrun --timeout {4 * hang_timeout} -- {tutorial_port} {world_size}", tutorial)
    raise AssertionError("expected torchrun's ranks to hang")
except nbddp.DDPTimeout as exc:
    under_torchrun = exc.result
finally:
    reserved.close()                           # free for the next run's own rendezvous
for r in under_torchrun.ranks:
    print(f"under torchrun, rank {r.rank}: {r.state}; blocked at {r.blocked_at}")

# %% tutorial-s-own-setup-note [markdown]
# The same file under `%%ddp`:

# %% tutorial-s-own-setup-ddp-2
get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60 -- {tutorial_port} {world_size}", tutorial)
own_rendezvous = _ddp

# %% tutorial-s-own-setup-note-2 [markdown]
# What cannot work on one machine fails at once, naming the line: an address that is not this machine's,
# a port another process holds, or a `world_size` other than the launch's. Plain torch does not fail there:
# with `world_size` one too many, the ranks wait for a rank that never comes, for `init_process_group`'s
# default timeout (30 minutes with gloo, 10 with NCCL). Run for real, the same file as plain `python`
# processes with `world_size` one too many, left 5 s after every one of them has said it joins:

# %% tutorial-s-own-setup-code
import glob, time
for f in glob.glob("runs/06/plain-*.out"):
    os.remove(f)
logs = [open(f"runs/06/plain-{r}.out", "w") for r in range(world_size)]
procs = [subprocess.Popen([sys.executable, "runs/06/tutorial.py", str(busy_port), str(world_size + 1)],
                          stdout=logs[r], stderr=subprocess.STDOUT, env=dict(clean, RANK=str(r)))
         for r in range(world_size)]

def joined():
    return sum("joins a group" in open(f"runs/06/plain-{r}.out").read() for r in range(world_size))

deadline = time.monotonic() + 120
while joined() < world_size and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep(5)
still_waiting = [p.poll() is None for p in procs]
for p in procs:
    p.kill(); p.wait()
for log in logs:
    log.close()
printed = [open(f"runs/06/plain-{r}.out").read() for r in range(world_size)]
print(f"plain torch, world_size={world_size + 1} with {world_size} processes: still waiting after 5 s:",
      still_waiting)

# %% tutorial-s-own-setup-note-3 [markdown]
# `%%ddp` refuses the same file with `world_size` one too many, at once:

# %% tutorial-s-own-setup-ddp-3
try:
    get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60 -- {tutorial_port} {world_size + 1}", tutorial)
    raise AssertionError("expected a DDPError")
except nbddp.DDPError as exc:
    wrong_size = exc.result
failed = [r for r in wrong_size.ranks if r.state == "failed"][0]
print(failed.cause, "\nHint:", failed.hint)

# %% tutorial-s-own-setup-code-2
assert under_torchrun.timed_out and any("init_process_group" in (r.stack or "") for r in under_torchrun.ranks), \
    [r.stack for r in under_torchrun.ranks]
assert joined() == world_size and all(still_waiting) and not any("rendezvous:" in out for out in printed), printed
assert own_rendezvous.ok and all(f"rendezvous: {world_size:.1f}" in r.stdout for r in own_rendezvous.ranks)
assert f"world_size={world_size + 1} (set at cell line " in failed.cause, failed.cause
assert f"but this %%ddp launch has {world_size} ranks" in failed.cause and failed.hint

# %% check [markdown]
# ## Check

# %% check-code
assert "cannot be split evenly over --nnodes 3" in config_errors["-n 4 --nnodes 3"]
assert "disagrees with --nproc-per-node 3 x --nnodes 2 = 6" in config_errors["-n 4 --nproc-per-node 3 --nnodes 2"]
assert alone.returncode != 0 and ("timed out" in alone.stderr.lower() or "timeout" in alone.stderr.lower())
print("ok: all four pitfalls reproduced and recognised")

# %% exercise [markdown]
# ## Exercise
# Fix the hanging cell of section 2 so that it finishes, still printing the sum on rank 0 only.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your fixed cell here; it starts with
#   %%ddp -n $world_size --timeout 60 --pull total@0
# and rank 0 sets `total` to the sum it printed.

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
# %%ddp -n $world_size --timeout 60 --pull total@0
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)              # every rank
total = t.item()
if rank == 0:
    print(f"sum = {total:.0f}")     # only the printing depends on the rank
dist.barrier()
dist.destroy_process_group()

# %% check-answer tags=["check"]
assert "total" in globals() or globals().get("_ddp") is not globals().get("wrong_size"), "✗ nothing to check yet: run your fixed cell (it ends with --pull total@0)"
assert _ddp.ok, f"✗ the cell did not finish: {_ddp.summary().splitlines()[0]} (every rank must call the collective, not only rank 0)"
assert "total" in globals(), "✗ no total came back: the cell's first line ends with --pull total@0, and rank 0 sets total"
assert total == world_size, f"✗ rank 0's sum is {total}, not {world_size}: read it after the all_reduce, to which every rank gives its 1"
print(f"✓ every rank reached the all_reduce; rank 0 printed sum = {total:.0f}")

# %% mistake-still-inside-if tags=["mistake"]
# %%ddp -n $world_size --timeout 30 --pull total@0
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
if rank == 0:
    dist.all_reduce(t)          # the barrier gone, the collective still on rank 0 only
    total = t.item()
    print(f"sum = {total:.0f}")
dist.destroy_process_group()
# expect: ✗ the cell did not finish

# %% mistake-read-before-all-reduce tags=["mistake"]
# %%ddp -n $world_size --timeout 60 --pull total@0
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
total = t.item()                # read before the all_reduce: rank 0's own 1
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"sum = {total:.0f}")
dist.destroy_process_group()
# expect: ✗ rank 0's sum is 1
