# %% title [markdown]
# # 19 · When a job hangs at scale: `monitored_barrier`, `TORCH_DISTRIBUTED_DEBUG`, the flight recorder
#
# A collective waits until **every** rank of the group has called it. One rank that is stuck (a deadlocked
# data loader, a rank in a debugger) or that called something else (a collective skipped under an `if`, a
# tensor of another shape) stops all the others, and on 1,000 GPUs the symptom is the same everywhere: every
# rank sits in a collective, and the one to blame looks like all the rest. Lesson 10 showed the stacks
# (`--timeout`) and one drill of `TORCH_DISTRIBUTED_DEBUG=DETAIL`; this lesson is about **naming the rank**:
#
# | tool | cost | what it tells | on CPU/gloo in torch 2.13 |
# |---|---|---|---|
# | `dist.monitored_barrier(timeout=...)` | one barrier where you put it | which ranks did **not arrive** | gloo only (§1) |
# | `TORCH_DISTRIBUTED_DEBUG=DETAIL` | an extra all-gather before **every** collective | the first collective whose type or shapes **differ** between ranks, with both | yes (§2) |
# | the **flight recorder** | a ring buffer of the last N collectives per rank, nearly free | each rank's **sequence** of collectives, to compare after a hang | records on gloo; the automatic dump on a timeout is NCCL's (§3) |

# %% parameters tags=["parameters"]
world_size = 2
fr_ranks = 4          # §3: a majority of ranks to compare the odd one with
out_dir = "runs/19"

# %% load-ext
# %load_ext nbddp

# %% monitored-barrier [markdown]
# ## 1 · `monitored_barrier`: who did not arrive
# Rank 1 is stuck for 4 s (here a `sleep`; in a real job, anything). Rank 0 waits in
# `dist.monitored_barrier(timeout=timedelta(seconds=2))`: unlike `dist.barrier()`, which would wait for the
# process group's timeout (30 minutes for gloo) and then say nothing about whom it waited for, rank 0 collects
# an acknowledgement from every other rank and, when one is missing after the timeout, raises naming it
# (`wait_all_ranks=True` lists all missing ranks instead of the first). It is implemented for **gloo only**
# (`ProcessGroup.monitored_barrier`; with NCCL, use a gloo group made for it with `dist.new_group(backend="gloo")`).

# %% monitored-barrier-ddp
# %%ddp -n $world_size --timeout 60 --pull said@0,waited@0
import time, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo")
rank = dist.get_rank()
said, waited = None, None
if rank == 1:
    time.sleep(4)                      # stuck: it never reaches the barrier in time
else:
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2))
    except RuntimeError as exc:
        said, waited = str(exc), time.monotonic() - start
        print(f"rank 0, after {waited:.1f} s: {said}")
dist.destroy_process_group()

# %% monitored-barrier-code
import re
assert _ddp.ok and re.search(r"Rank 1 failed to pass monitoredBarrier in 2000 ms", said), said
assert 2 <= waited < 4, waited                  # the barrier's own timeout, not the stuck rank's 4 s
print("named:", re.search(r"Rank \d+ failed to pass monitoredBarrier in \d+ ms", said).group(0))

# %% detail [markdown]
# ## 2 · `TORCH_DISTRIBUTED_DEBUG=DETAIL`: the first collective that differs
# With `DETAIL` (set before `init_process_group`: here with `--env`), every process group is wrapped, and
# before each collective the ranks all-gather a **fingerprint** of it (type, shapes, dtypes, devices) over a
# helper gloo group and compare. Below, three mistakes on 2 ranks: a tensor of another shape on rank 0, a
# different collective on rank 1, and a different **reduce op** (`SUM` on rank 0, `MAX` on rank 1).

# %% detail-ddp
# %%ddp -n $world_size --timeout 60 --env TORCH_DISTRIBUTED_DEBUG=DETAIL --pull said,reduced
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
said = {}
try:                                                   # 1: another shape
    dist.all_reduce(torch.ones(3 if rank == 0 else 4))
except RuntimeError as exc:
    said["shape"] = str(exc)
t = torch.ones(4)
try:                                                   # 2: another collective
    dist.all_reduce(t) if rank == 0 else dist.all_gather([torch.ones(4), torch.ones(4)], t)
except RuntimeError as exc:
    said["op"] = str(exc)
reduced = torch.tensor([1.0, 2.0]) * (rank + 1)        # 3: another reduce op: [1, 2] and [2, 4]
dist.all_reduce(reduced, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
print(f"rank {rank}: caught {sorted(said)}; SUM on rank 0 and MAX on rank 1 gave {reduced.tolist()}")
dist.destroy_process_group()

# %% detail-code
shape_said = said[0]["shape"].split(", TensorDeviceTypes")[0]
print("shape:", shape_said)
print("op:   ", said[1]["op"].split(", TensorShape")[0])
assert set(said[0]) == set(said[1]) == {"shape", "op"}, said
assert "Detected mismatch between collectives on ranks" in said[0]["shape"] and "TensorShape=[3]" in said[0]["shape"]
assert "TensorShape=[4]" in said[0]["shape"].split("but Rank 1")[1]
assert "OpType=ALLREDUCE" in said[0]["op"] and "OpType=ALLGATHER" in said[0]["op"].split("but Rank 1")[1]
print("SUM on rank 0, MAX on rank 1:", [v.tolist() for v in reduced], "(sum [3, 6], max [2, 4])")
assert all(reduced[r].tolist() == [3.0, 6.0] for r in range(world_size)), reduced   # rank 1's MAX ignored

# %% detail-note [markdown]
# The shape and the collective are caught on both ranks, before anything is sent, with both fingerprints in
# the message. The reduce op is **not** part of the fingerprint: the third all-reduce ran without a word, and
# rank 1, which asked for the max `[2, 4]`, got the sum `[3, 6]`, like rank 0 (what a mismatched op gives
# depends on the backend's algorithm; nothing says it happened). A wrong reduce op is found only by checking
# results. `DETAIL` also costs an extra all-gather per collective, which is why it is
# a debugging switch, not a setting for a run at scale; there, the flight recorder is on instead.

# %% flight-recorder [markdown]
# ## 3 · The flight recorder: each rank's last collectives
# Every process group records each collective it is asked for in a ring buffer (torch 2.13:
# `TORCH_FR_BUFFER_SIZE` entries, default 2000, `torch/csrc/distributed/c10d/FlightRecorder.hpp`; the older
# name `TORCH_NCCL_TRACE_BUFFER_SIZE` still works): a sequence number per group (`collective_seq_id`), the
# collective (`profiling_name`), the shapes and dtypes, the group, a Python stack. In torch 2.13 **gloo
# records too**; `torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives, onlyActive)`
# returns a rank's buffer as JSON (`_dump_fr_trace(includeCollectives, includeStackTraces, onlyActive)` as a pickle, the format of the analyzer below).
#
# What needs **NCCL** (a CUDA build of torch, not this one): the watchdog thread that notices a collective past
# its timeout and **dumps every rank's buffer by itself** (`TORCH_NCCL_DUMP_ON_TIMEOUT`, with
# `TORCH_NCCL_ENABLE_MONITORING`; files named by `TORCH_FR_DUMP_TEMP_FILE`, or the older
# `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`, plus a rank number), and the
# `started` / `completed` states with durations (CUDA events). On gloo each entry stays `scheduled`, and a
# rank dumps its buffer when the script says so: below, when its collective times out.
#
# The job: 4 ranks, 6 steps, an all-reduce of the gradients per step, and a process group timeout of 2 s.
# At step 3 rank 2 gets stuck (a deadlock in its data loader, say) for longer than that. A small thread in
# each rank plays the watchdog's part: when the first rank times out, it asks all ranks to dump (a file here;
# NCCL signals through the store), so rank 2's buffer is read **while it is still stuck**, as on a cluster.

# %% flight-recorder-clean
import os, shutil
shutil.rmtree(f"{out_dir}/fr", ignore_errors=True); os.makedirs(f"{out_dir}/fr")

# %% flight-recorder-ddp
# %%ddp -n $fr_ranks --timeout 60 --env TORCH_FR_BUFFER_SIZE=64 --push out_dir --pull trace,error
import json, os, threading, time, torch, torch.distributed as dist
from datetime import timedelta
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json
dist.init_process_group("gloo", timeout=timedelta(seconds=2))
rank = dist.get_rank()
dump_now = f"{out_dir}/fr/dump-now"

def dump_when_told():        # what NCCL's watchdog does by itself: every rank dumps when one timed out
    while not os.path.exists(dump_now):
        time.sleep(0.02)
    open(f"{out_dir}/fr/rank_{rank}", "wb").write(_dump_fr_trace(True, True, False))   # for the analyzer
    open(f"{out_dir}/fr-json-{rank}", "wb").write(_dump_fr_trace_json(True, False))

watcher = threading.Thread(target=dump_when_told, daemon=True)
watcher.start()
error = None
try:
    for step in range(6):
        if step == 3 and rank == 2:
            time.sleep(4)                                  # stuck, past the group's 2 s timeout
        grads = torch.ones(10) * rank
        dist.all_reduce(grads)
except RuntimeError as exc:
    error = str(exc).splitlines()[0][:160]
    open(dump_now, "w").close()                            # the first rank to time out asks all to dump
watcher.join(timeout=20)
trace = [{k: e[k] for k in ("collective_seq_id", "profiling_name", "input_sizes", "state")}
         for e in json.loads(open(f"{out_dir}/fr-json-{rank}").read())["entries"]]
print(f"rank {rank}: last recorded collective #{trace[-1]['collective_seq_id']} {trace[-1]['profiling_name']}; "
      f"{'error: ' + error if error else 'no error'}")

# %% read-traces [markdown]
# Every rank ended (the 2 s timeout turned the hang into errors; rank 2's own all-reduce #4, once it woke,
# found its peers gone), and each wrote its buffer when asked. Laid side by side,
# one column per rank, one row per sequence number:

# %% read-traces-code
last = {r: trace[r][-1]["collective_seq_id"] for r in range(fr_ranks)}
for seq in range(1, max(last.values()) + 1):
    row = []
    for r in range(fr_ranks):
        e = next((e for e in trace[r] if e["collective_seq_id"] == seq), None)
        row.append(f"{e['profiling_name']}{e['input_sizes']}" if e else "—")
    print(f"#{seq}: " + " | ".join(f"{cell:22}" for cell in row))
behind = [r for r in range(fr_ranks) if last[r] < max(last.values())]
print("last collective per rank:", last, "-> behind:", behind)
assert behind == [2] and last[2] == 3 and all(last[r] == 4 for r in (0, 1, 3)), last
assert all(e["state"] == "scheduled" for r in range(fr_ranks) for e in trace[r])   # gloo: no started/completed
assert all(error[r] for r in range(fr_ranks)), error                                 # each rank raised

# %% read-traces-note [markdown]
# Ranks 0, 1 and 3 entered all-reduce #4 and waited; rank 2's last recorded collective is #3: it never got
# to #4. That is the reading the analyzer automates on a cluster: **the rank whose sequence stops early is
# where to look** (its stack: lesson 10), and a rank whose entry at the same sequence number is another
# collective, or other shapes, has **diverged**. torch ships the analyzer, `python -m
# torch.distributed.flight_recorder.fr_trace DIR -p PREFIX` (one file per rank, as written above). On
# gloo's dumps it fails in torch 2.13, because gloo's buffer names the group `''` in its `pg_config` while
# its entries name it `'0'`:

# %% fr-trace-code
import re, subprocess, sys
analyzer = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", f"{out_dir}/fr",
                           "-p", "rank_"], capture_output=True, text=True, timeout=120)
import pickle
dump0 = pickle.load(open(f"{out_dir}/fr/rank_0", "rb"))
print(analyzer.stderr.strip().splitlines()[-1])
print("pg_config names:", list(dump0["pg_config"]), "| entries' group:", dump0["entries"][0]["process_group"])
assert analyzer.returncode != 0 and re.search(r"KeyError: \('0', \d\)", analyzer.stderr), analyzer.stderr[-500:]
assert list(dump0["pg_config"]) == [""] and dump0["entries"][0]["process_group"][0] == "0", dump0["pg_config"]

# %% check [markdown]
# ## Check

# %% check-code
assert _ddp.ok and behind == [2]
print("ok: monitored_barrier named rank 1; DETAIL caught the shape and the collective but not the reduce op; "
      "the flight recorder's sequences named rank 2 as the one that stopped")

# %% exercise [markdown]
# ## Exercise
# Write `diverged(traces)`: given one trace per rank (a list of entries as `trace` above:
# `collective_seq_id`, `profiling_name`, `input_sizes`), return the rank to look at first: the first sequence
# number at which the ranks do not all agree, and there the rank that differs from the majority, either by
# having **no entry** (it never got there) or **another collective or shapes**. The check tries it on the
# recorded `trace` and on a made-up one in which every rank recorded 4 collectives, but rank 1's #2 was an
# all-gather.
#
# Try it in the cell below first, then run the **check** at the end of this section: it says in one line what
# is still wrong. The solution is folded in between (click its bar to open it).

# %% try-it tags=["exercise"]
# Your function here:
#   def diverged(traces): ...

# %% solution [markdown]
# ### Solution
# Folded: click the bar below (or its ⋯) to open it.

# %% solution-code tags=["solution"]
from collections import Counter

def diverged(traces):
    by_seq = [{e["collective_seq_id"]: (e["profiling_name"], str(e["input_sizes"])) for e in t} for t in traces]
    for seq in sorted(set().union(*by_seq)):
        seen = [s.get(seq) for s in by_seq]                     # None: this rank never got there
        usual, count = Counter(seen).most_common(1)[0]
        if count < len(seen):
            return next(r for r, what in enumerate(seen) if what != usual)
    return None

# %% check-answer tags=["check"]
assert "diverged" in globals(), "✗ nothing to check yet: define diverged(traces)"
ar = lambda seq, n=10: {"collective_seq_id": seq, "profiling_name": "gloo:all_reduce", "input_sizes": [[n]]}
made_up = [[ar(1), ar(2), ar(3), ar(4)] for _ in range(4)]
made_up[1][1] = {"collective_seq_id": 2, "profiling_name": "gloo:all_gather", "input_sizes": [[10]]}
said_recorded = diverged([trace[r] for r in range(fr_ranks)])
assert said_recorded == 2, f"✗ on the recorded traces diverged() says {said_recorded!r}: rank 2 is the one whose sequence stops at #3"
said_made_up = diverged(made_up)
assert said_made_up is not None, "✗ on the made-up traces diverged() says None: all ranks recorded 4 collectives, but compare what each one was"
assert said_made_up == 1, f"✗ on the made-up traces diverged() says {said_made_up!r}: every rank recorded 4 collectives, so counting them finds nothing; rank 1's #2 was an all-gather"
print("✓ diverged() finds the rank that stopped early and the rank that ran another collective")

# %% mistake tags=["mistake"]
def diverged(traces):
    return min(range(len(traces)), key=lambda r: len(traces[r]))     # "the rank with the fewest collectives"
# expect: ✗ on the made-up traces diverged\(\) says 0: every rank recorded 4
