# %% title [markdown]
# # 02 · What the launcher does (启动器做了什么)
#
# `torchrun` (and the older `python -m torch.distributed.launch`, which since torch 1.9 hands its arguments to
# torchrun's own code) does three things:
# 1. starts `nproc_per_node` copies of your script on each machine,
# 2. gives each copy its **environment variables** (rank, world size, meeting point, …),
# 3. watches them: if one fails, it stops the others (and can restart the job).
#
# Your script never talks to the launcher; it only reads the environment. `%%ddp` sets exactly the variables
# torchrun sets, so a cell that works here works as a script under torchrun.

# %% parameters tags=["parameters"]
world_size = 2

# %% load-ext
# %load_ext nbddp

# %% full-environment-one-rank [markdown]
# ## 1 · The full environment of one rank

# %% full-environment-one-rank-ddp
# %%ddp -n $world_size --ranks 0 --timeout 60 --pull mine
import os
KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
for k in sorted(mine):
    print(f"{k:32} {mine[k]}")

# %% full-environment-one-rank-note [markdown]
# | variable | set to |
# |---|---|
# | `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE` | lesson 01 |
# | `GROUP_RANK`, `GROUP_WORLD_SIZE` | node rank and number of nodes |
# | `ROLE_*` | for jobs with several roles (trainer, parameter server…); one role `default` here |
# | `MASTER_ADDR`, `MASTER_PORT` | the store every rank connects to during `init_process_group` |
# | `TORCHELASTIC_*` | run id, restart count, error file (a rank writes its traceback there if its main is decorated with `@record` from `torch.distributed.elastic.multiprocessing.errors`) |
# | `OMP_NUM_THREADS=1` | when several ranks share a machine: stops them fighting over the cores |

# %% full-environment-one-rank-code
envs = dict(enumerate(mine))          # every rank's `mine` (--pull mine; --ranks 0 only chose what is shown)
local_keys = set().union(*(e.keys() for e in envs.values()))
print(sorted(local_keys))
import os
if os.path.exists("env_under_torchrun.json"):   # a previous run's file: the next cell must write it anew
    os.remove("env_under_torchrun.json")

# %% same-cell-under-real [markdown]
# ## 2 · The same cell under real torchrun
# `--launcher torchrun` hands the cell to torch's own launcher (`torch.distributed.run`). Slower (it starts
# fresh Python processes), but it is the real thing: compare the keys. Its ranks are torchrun's own
# processes, so `--pull` cannot reach them; rank 0 saves its environment to a file instead, as a script would.

# %% same-cell-under-real-ddp
# %%ddp -n $world_size --launcher torchrun --ranks 0 --timeout 60
import os, json
KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
if os.environ["RANK"] == "0":
    with open("env_under_torchrun.json", "w") as f:
        json.dump(mine, f)

# %% same-cell-under-real-code
import json
torchrun_env = json.load(open("env_under_torchrun.json"))
print("only under torchrun:", sorted(set(torchrun_env) - local_keys))
print("only under %%ddp:   ", sorted(local_keys - set(torchrun_env)))

# %% legacy-launcher-local_rank-argv [markdown]
# ## 3 · The legacy launcher: `--local_rank` in argv
# `python -m torch.distributed.launch --nproc_per_node=2 train.py` (deprecated) did not only set variables:
# it **added `--local_rank=N` to your script's arguments** (unless you passed `--use_env`). Scripts of that
# era therefore have `parser.add_argument("--local_rank", type=int)`. That was torch **before 2.0**;
# `%%ddp --legacy-launch underscore` reproduces it (`--legacy-launch` alone gives today's spelling).

# %% legacy-launcher-local_rank-argv-ddp
# %%ddp -n $world_size --legacy-launch underscore --timeout 60 -- --lr 0.1
import argparse, sys
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)     # the old way
parser.add_argument("--lr", type=float)
args = parser.parse_args()
print(f"argv={sys.argv[1:]} -> args.local_rank={args.local_rank}")

# %% legacy-launcher-local_rank-argv-note [markdown]
# **What torch 2.x really does.** The articles' parser, with only `--local_rank`, run by the real
# `torch.distributed.launch` of this torch: since 2.0 it passes `--local-rank=N` (with a dash), which that
# parser rejects. It runs for real below as two "nodes" on this machine (two launcher processes, `--nnodes 2`,
# no `--master-port`), which also shows torch's **default port, 29500**; beside them, the same script under a
# plain one-node `torchrun --nproc-per-node 1`, no port either.
#
# **The default port changed in torch 2.12.** Up to torch 2.11, every launch without `--master-port` (nor
# `--standalone` or `--rdzv-endpoint`) met at 29500, one node or many (`--master-port` had `default=29500` in
# `torch/distributed/run.py`), so two single-node jobs on one machine collided: the second one fails with
# `EADDRINUSE` (lesson 06). Since torch 2.12
# ([pytorch#175699](https://github.com/pytorch/pytorch/pull/175699), fixing
# [#126510](https://github.com/pytorch/pytorch/issues/126510)), a launch of one node with no port, endpoint or
# rendezvous backend given takes `--standalone`'s road: a c10d rendezvous at `localhost:0`, where the operating
# system picks a free port. Precisely (`run()` in `torch/distributed/run.py`): the rendezvous backend is `static`
# (the default, or given explicitly), there is no `--rdzv-endpoint`, no `--master-port` (nor `PET_MASTER_PORT`
# in the environment), and the largest `--nnodes` is 1 — so `--nnodes 1:2` still meets at 29500; `--master-addr`
# is then ignored. Several nodes with no port still meet at 29500: every node must know the port before it
# starts. `%%ddp` picks a free one for every launch.

# %% legacy-launcher-local_rank-argv-code
import os, subprocess, sys
os.makedirs("runs/02", exist_ok=True)
with open("runs/02/old_parser.py", "w") as f:
    f.write("import argparse, os\n"
            "print('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\n"
            "parser = argparse.ArgumentParser()\n"
            "parser.add_argument('--local_rank', type=int, default=-1)   # the articles' parser\n"
            "print(parser.parse_args())\n")
launch = [sys.executable, "-m", "torch.distributed.launch", "--nnodes", "2", "--nproc-per-node", "1",
          "--master-addr", "127.0.0.1"]
nodes = [subprocess.Popen(launch + ["--node-rank", str(i), "runs/02/old_parser.py"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) for i in range(2)]
one_node = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                             "runs/02/old_parser.py"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
real_launch = [node.communicate(timeout=120)[0] for node in nodes]
one_node_out = one_node.communicate(timeout=120)[0]
print("python -m torch.distributed.launch --nnodes 2, node 0:")
for line in real_launch[0].splitlines():
    if line.startswith(("MASTER_PORT", "old_parser.py: error")) or "deprecated" in line:
        print("   ", line.split(": ", 1)[1] if "FutureWarning" in line else line)   # the warning without its path
print("torchrun --nproc-per-node 1 (one node), no port:")
print("   ", next(line for line in one_node_out.splitlines() if line.startswith("MASTER_PORT")))
print("   ", next(line for line in one_node_out.splitlines() if line.startswith("Namespace")))

# %% legacy-launcher-local_rank-argv-note-2 [markdown]
# The same script under `torchrun` gets no such argument at all — `args.local_rank` stays `-1`. And
# `torch.cuda.set_device(-1)` does **not** fail: torch documents a negative device as a no-op, so every rank
# silently stays on the default device, `cuda:0` — all ranks on GPU 0, the articles' first cause of
# out-of-memory. That is the usual migration bug; `set_device(-1)` runs even here, without a GPU:

# %% legacy-launcher-local_rank-argv-ddp-2
# %%ddp -n $world_size --timeout 60 --pull parsed -- --lr 0.1
import argparse, os, sys, torch
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--lr", type=float)
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)        # -1: a silent no-op, no error
parsed = {"args.local_rank": args.local_rank, "LOCAL_RANK": int(os.environ["LOCAL_RANK"])}
print(f"argv={sys.argv[1:]} -> {parsed}; set_device({args.local_rank}) raised nothing")

# %% legacy-launcher-local_rank-argv-code-2
import torch
for rank, p in enumerate(parsed):
    assert p == {"args.local_rank": -1, "LOCAL_RANK": rank}, p
if any("EADDRINUSE" in out for out in real_launch):   # another job holds 29500 right now: the collision itself
    print("port 29500 is taken on this machine at the moment: exactly the default-port collision above")
else:
    assert all("MASTER_PORT 29500" in out for out in real_launch), real_launch
    assert all("unrecognized arguments: --local-rank=" in out for out in real_launch), real_launch
assert "Namespace(local_rank=-1)" in one_node_out, one_node_out   # torchrun added no --local-rank to argv
one_node_port = int(next(line for line in one_node_out.splitlines() if line.startswith("MASTER_PORT")).split()[1])
if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 12):
    assert one_node_port != 29500, one_node_out            # a free port, chosen by the operating system
else:
    assert one_node_port == 29500, one_node_out            # torch <= 2.11: the default for one node too
print(f"torch {torch.__version__}: several nodes without a port meet at 29500; one node at {one_node_port}")
print("torch 2.x's launcher passes --local-rank=N, torchrun passes nothing; LOCAL_RANK is in the environment")

# %% random-master-port [markdown]
# > **"Pick a random `MASTER_PORT`"** (`MASTER_PORT=$((RANDOM + 10000))`, `random.randint(…)`), as articles
# > advise against 29500, only makes a collision rarer: two jobs can draw the same number, the number can
# > belong to a service that already listens there, and another process can take it between the draw and the
# > bind. Let the operating system choose instead: port 0 means "any free port", taken in the same step.
# > `torchrun --standalone` (any torch 2.x) or `--rdzv-backend c10d --rdzv-endpoint localhost:0` does that (the
# > endpoint alone is not enough: the backend stays `static`, which hands the literal port 0 to the ranks as
# > `MASTER_PORT`, and `init_process_group` never connects), and since torch 2.12 a
# > plain one-node `torchrun` without a port does too (above). Across machines every node must know the port
# > before it starts: pass the same `--master-port`, free on node 0 and open in its firewall (lesson 07).

# %% migration-torch-distributed-launch [markdown]
# ### Migration `torch.distributed.launch` → `torchrun`
#
# | before | after |
# |---|---|
# | `python -m torch.distributed.launch --nproc_per_node=4 train.py` | `torchrun --nproc_per_node=4 train.py` |
# | `... launch --use_env ...` (variables instead of argv) | the only way in torchrun, which has no such flag |
# | `parser.add_argument("--local_rank", type=int)`; `args.local_rank` | `local_rank = int(os.environ["LOCAL_RANK"])` |
# | `--master_addr`, `--master_port`, `--nnodes`, `--node_rank` | the same options (torchrun also offers `--rdzv-endpoint`) |
# | a failed rank: the launcher stops the others | the same agent: since torch 1.9 `launch` calls torchrun's `run()`, so both stop all ranks, set `TORCHELASTIC_ERROR_FILE` for the ranks, accept `--max-restarts` |
#
# > **`--use_env`** told the old launcher to leave argv alone: the script reads `LOCAL_RANK` from the
# > environment instead of getting `--local_rank=N`. torchrun made that the only way: `torch/distributed/run.py`
# > adds `--local-rank=N` to argv only when `use_env` is false, and only `launch.py` defines the flag. In torch
# > 2.13 `launch.py` still accepts `--use-env` / `--use_env` (off by default) and warns on every start that the
# > module "is deprecated and will be removed in future" (the `FutureWarning` above). Mind torch's own docstring
# > at the top of `torch/distributed/run.py`: it still says "`torchrun` will pass the `--local-rank=<rank>`
# > argument to your script" (a note from 2.0); the code does that only for `launch.py` without `--use-env`
# > (`get_use_env` returns `True` for torchrun, which has no `use_env`), as the plain `torchrun` run above shows (its
# > parser got no argument: `local_rank=-1`). What is left of it:

# %% migration-torch-distributed-launch-code
import inspect
import torch.distributed.launch as old_launcher, torch.distributed.run as torchrun_module
assert old_launcher.run is torchrun_module.run       # the old launcher hands everything to torchrun's run()
print(inspect.getsource(old_launcher.launch))

# %% check [markdown]
# ## Check

# %% check-code
must = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE"}
assert must <= local_keys, must - local_keys
assert local_keys == set(torchrun_env), (local_keys ^ set(torchrun_env))
assert envs[0]["WORLD_SIZE"] == str(world_size) and envs[0]["RANK"] == "0"
if world_size > 1:
    assert envs[0]["OMP_NUM_THREADS"] == "1"
print("ok: %%ddp gives each rank the same variables as torchrun")

# %% exercise [markdown]
# ## Exercise
# Write an argument parser that works under **both** launchers: it accepts `--local_rank` / `--local-rank`
# when the old launcher passes it, and otherwise falls back to `LOCAL_RANK` from the environment. Run it with
# `--legacy-launch` and without.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your parser here, as a string `both_ways` (a script whose ranks set `parsed` to the local rank they found),
# run three ways, keeping what each run pulled, or the error when its ranks failed:
#   parsed_by_launch = {}
#   for how in ("--legacy-launch", "--legacy-launch underscore", ""):
#       try:
#           get_ipython().run_cell_magic("ddp", f"-n {world_size} {how} --timeout 60 --pull parsed", both_ways)
#           parsed_by_launch[how] = parsed
#       except Exception as failed:       # e.g. argparse rejected the argv and the ranks exited
#           parsed_by_launch[how] = failed

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-ddp tags=["solution"]
both_ways = '''
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
args = parser.parse_args()
parsed = args.local_rank
print(f"local_rank={parsed}")
'''
parsed_by_launch = {}
for how in ("--legacy-launch", "--legacy-launch underscore", ""):
    try:
        get_ipython().run_cell_magic("ddp", f"-n {world_size} {how} --output text --timeout 60 --pull parsed", both_ways)
        parsed_by_launch[how] = parsed
    except Exception as failed:
        parsed_by_launch[how] = failed

# %% check-answer tags=["check"]
assert "parsed_by_launch" in globals(), "✗ nothing to check yet: run your parser three ways into `parsed_by_launch`"
assert len(parsed_by_launch) == 3, f"✗ {len(parsed_by_launch)} launches: run it with --legacy-launch, --legacy-launch underscore and neither"
assert world_size > 1, f"✗ world_size is {world_size}: with one rank every local rank is 0, so a parser that ignores LOCAL_RANK would pass; run the lesson with world_size 2 or more"
for how, got in parsed_by_launch.items():
    assert not isinstance(got, BaseException), f"✗ launched with {how or 'no legacy flag'!r}, the ranks exited with an error: the parser must accept both --local-rank=N and --local_rank=N"
    assert got == list(range(world_size)), f"✗ launched with {how or 'no legacy flag'!r}, the ranks parsed local ranks {got}, not {list(range(world_size))}: without the flag, fall back to LOCAL_RANK"
print("✓ the parser works with --local-rank=N, --local_rank=N and with LOCAL_RANK only")

# %% mistake tags=["mistake"]
both_ways = '''
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)      # the articles' parser
parsed = parser.parse_args().local_rank
'''
parsed_by_launch = {}
for how in ("--legacy-launch", "--legacy-launch underscore", ""):
    try:
        get_ipython().run_cell_magic("ddp", f"-n {world_size} {how} --output text --timeout 60 --pull parsed", both_ways)
        parsed_by_launch[how] = parsed
    except Exception as failed:
        parsed_by_launch[how] = failed
# expect: ✗ launched with '--legacy-launch', the ranks exited with an error

# %% mistake-no-env-fallback tags=["mistake"]
both_ways = '''
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=0)   # both spellings, no LOCAL_RANK
parsed = parser.parse_args().local_rank
'''
parsed_by_launch = {}
for how in ("--legacy-launch", "--legacy-launch underscore", ""):
    try:
        get_ipython().run_cell_magic("ddp", f"-n {world_size} {how} --output text --timeout 60 --pull parsed", both_ways)
        parsed_by_launch[how] = parsed
    except Exception as failed:
        parsed_by_launch[how] = failed
# expect: ✗ launched with 'no legacy flag', the ranks parsed local ranks \[0(, 0)*\]
