"""Build the lesson notebooks 01-10, 12 and 13 (unexecuted) from the cell texts below.

    python notebooks/build.py            # writes notebooks/NN_*.ipynb
    python notebooks/build.py --check    # exits 1 when a committed notebook differs from this script

Every lesson: prose, a papermill ``parameters`` cell, runnable ``%%ddp`` cells, a check cell
that asserts the outcome, and an exercise with its solution in a separate cell (tagged
``solution``). Cells that show an error catch it and assert on it, so papermill runs clean.
tests/test_notebooks.py executes them all.
"""
from __future__ import annotations

import os
import sys
import textwrap

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
LESSONS: list[tuple[str, list]] = []


def md(text):
    return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text, *tags):
    cell = nbformat.v4.new_code_cell(textwrap.dedent(text).strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def params(text):
    return code(text, "parameters")


def lesson(name):
    def register(fn):
        LESSONS.append((name, fn()))
        return fn
    return register


LOAD = "%load_ext nbddp"  # no %matplotlib inline: ipykernel renders plots inline by default


# --------------------------------------------------------------------------------------- 01
@lesson("01_world_size_and_ranks")
def _01():
    return [
        md("""
        # 01 · World size, rank, local rank, master address and port

        A distributed job is a set of processes that cooperate. Four numbers tell each process who it is:

        | term | 中文 | meaning |
        |---|---|---|
        | `WORLD_SIZE` | 世界大小 | how many processes take part in the whole job (all machines) |
        | `RANK` | 全局秩 (rank) | this process's number in the job, `0 … WORLD_SIZE-1`; rank 0 is usually the "main" one |
        | `LOCAL_RANK` | 本地秩 | its number **on its machine**, `0 … nproc_per_node-1`; picks the GPU: `cuda:LOCAL_RANK`, so `nproc_per_node` must not exceed the machine's GPUs |
        | `GROUP_RANK` (node_rank) | 节点秩 | which machine (node) it runs on, `0 … nnodes-1` |
        | `MASTER_ADDR` / `MASTER_PORT` | 主节点地址 / 端口 | where every process meets the others at start (rank 0's machine) |

        They are tied together by one formula:

        **global rank = node_rank × nproc_per_node + local_rank**, and **world size = nnodes × nproc_per_node**.

        `%%ddp` runs a cell as such a job on this machine, and with `--nnodes` it *simulates* several machines, so
        the arithmetic can be seen without a cluster.
        """),
        params("""
        world_size = 2        # ranks for the first cell
        nnodes = 2            # simulated machines for the layout
        nproc_per_node = 2    # ranks per simulated machine
        """),
        code(LOAD),
        md("""
        ## 1 · Every rank reads who it is
        The launcher (torchrun, or `%%ddp`) puts the numbers in environment variables; `init_process_group`
        reads them (`env://`) and then `dist.get_rank()` / `dist.get_world_size()` agree with them.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull seen
        import os, torch.distributed as dist
        dist.init_process_group("gloo")
        seen = {"RANK": int(os.environ["RANK"]), "WORLD_SIZE": int(os.environ["WORLD_SIZE"]),
                "meeting point": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                "get_rank()": dist.get_rank(), "get_world_size()": dist.get_world_size()}
        print(seen)
        dist.destroy_process_group()
        """),
        md("""
        `--pull seen` brings each rank's `seen` back into the notebook: a list indexed by rank, so the check below
        reads values, not printed text.
        """),
        code("""
        for rank, s in enumerate(seen):
            assert s["RANK"] == s["get_rank()"] == rank and s["WORLD_SIZE"] == s["get_world_size()"] == world_size, s
        ports = {s["meeting point"] for s in seen}
        assert len(ports) == 1, ports          # every rank meets at the same address:port
        print("all ranks agree on the meeting point", ports.pop())
        """),
        md("""
        ## 2 · Simulated nodes: the layout
        `--nnodes 2 --nproc-per-node 2` gives 4 ranks as if on 2 machines with 2 processes each. Each rank prints
        its node (`GROUP_RANK`), local rank and global rank; `--pull layout` collects them.
        """),
        code("""
        %%ddp --nnodes $nnodes --nproc-per-node $nproc_per_node --timeout 60 --pull layout
        import os
        layout = {k: int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")}
        """),
        code("""
        for me in layout:
            print(f"node {me['GROUP_RANK']}  local_rank {me['LOCAL_RANK']}  ->  rank {me['RANK']}"
                  f" = {me['GROUP_RANK']} x {me['LOCAL_WORLD_SIZE']} + {me['LOCAL_RANK']}")
        """),
        md("The same as a picture: one row per node, one box per process."),
        code("""
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
        """),
        md("## Check"),
        code("""
        assert len(layout) == nnodes * nproc_per_node
        assert sorted(m["RANK"] for m in layout) == list(range(nnodes * nproc_per_node))
        for m in layout:
            assert m["RANK"] == m["GROUP_RANK"] * nproc_per_node + m["LOCAL_RANK"], m
            assert m["WORLD_SIZE"] == nnodes * nproc_per_node and m["LOCAL_WORLD_SIZE"] == nproc_per_node
        print("ok: global rank = node_rank x nproc_per_node + local_rank for every rank")
        """),
        md("""
        ## Exercise
        A job runs on 3 machines with 2 processes each. Which global rank has local rank 1 on node 2, and what is
        the world size? Work it out, then confirm it with a `%%ddp` cell on 3 simulated nodes.
        """),
        md("### Solution"),
        code("""
        %%ddp --nnodes 3 --nproc-per-node 2 --ranks 5 --timeout 60
        import os
        print(f"node {os.environ['GROUP_RANK']} local {os.environ['LOCAL_RANK']} -> rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}")
        """, "solution"),
        code("""
        assert "node 2 local 1 -> rank 5 of 6" in _ddp.ranks[5].stdout    # 2 x 2 + 1 = 5; 3 x 2 = 6
        print(_ddp.ranks[5].stdout)
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 02
@lesson("02_what_the_launcher_sets")
def _02():
    return [
        md("""
        # 02 · What the launcher does (启动器做了什么)

        `torchrun` (and the older `python -m torch.distributed.launch`) does three things:
        1. starts `nproc_per_node` copies of your script on each machine,
        2. gives each copy its **environment variables** (rank, world size, meeting point, …),
        3. watches them: if one fails, it stops the others (and can restart the job).

        Your script never talks to the launcher; it only reads the environment. `%%ddp` sets exactly the variables
        torchrun sets, so a cell that works here works as a script under torchrun.
        """),
        params("world_size = 2"),
        code(LOAD),
        md("## 1 · The full environment of one rank"),
        code("""
        %%ddp -n $world_size --ranks 0 --timeout 60 --pull mine
        import os
        KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
        for k in sorted(mine):
            print(f"{k:32} {mine[k]}")
        """),
        md("""
        | variable | set to |
        |---|---|
        | `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE` | lesson 01 |
        | `GROUP_RANK`, `GROUP_WORLD_SIZE` | node rank and number of nodes |
        | `ROLE_*` | for jobs with several roles (trainer, parameter server…); one role `default` here |
        | `MASTER_ADDR`, `MASTER_PORT` | the store every rank connects to during `init_process_group` |
        | `TORCHELASTIC_*` | run id, restart count, error file (where a failing rank writes its traceback) |
        | `OMP_NUM_THREADS=1` | when several ranks share a machine: stops them fighting over the cores |
        """),
        md("`--pull mine` brought every rank's `mine` back (all ranks ran; `--ranks 0` only chose what is shown):"),
        code("""
        envs = dict(enumerate(mine))
        local_keys = set().union(*(e.keys() for e in envs.values()))
        print(sorted(local_keys))
        """),
        md("""
        ## 2 · The same cell under real torchrun
        `--launcher torchrun` hands the cell to torch's own launcher (`torch.distributed.run`). Slower (it starts
        fresh Python processes), but it is the real thing: compare the keys. Its ranks are torchrun's own
        processes, so `--pull` cannot reach them; rank 0 saves its environment to a file instead, as a script would.
        """),
        code("""
        %%ddp -n $world_size --launcher torchrun --ranks 0 --timeout 60
        import os, json
        KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
        if os.environ["RANK"] == "0":
            with open("env_under_torchrun.json", "w") as f:
                json.dump(mine, f)
        """),
        code("""
        import json
        torchrun_env = json.load(open("env_under_torchrun.json"))
        print("only under torchrun:", sorted(set(torchrun_env) - local_keys))
        print("only under %%ddp:   ", sorted(local_keys - set(torchrun_env)))
        """),
        md("""
        ## 3 · The legacy launcher: `--local_rank` in argv
        `python -m torch.distributed.launch --nproc_per_node=2 train.py` (deprecated) did not only set variables:
        it **added `--local_rank=N` to your script's arguments** (unless you passed `--use_env`). Scripts of that
        era therefore have `parser.add_argument("--local_rank", type=int)`. That was torch **before 2.0**;
        `%%ddp --legacy-launch underscore` reproduces it (`--legacy-launch` alone gives today's spelling).
        """),
        code("""
        %%ddp -n $world_size --legacy-launch underscore --timeout 60 -- --lr 0.1
        import argparse, sys
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=-1)     # the old way
        parser.add_argument("--lr", type=float)
        args = parser.parse_args()
        print(f"argv={sys.argv[1:]} -> args.local_rank={args.local_rank}")
        """),
        md("""
        **What torch 2.x really does.** The articles' parser, with only `--local_rank`, run by the real
        `torch.distributed.launch` of this torch: since 2.0 it passes `--local-rank=N` (with a dash), which that
        parser rejects. Run for real below as two "nodes" on this machine (two launcher processes, `--nnodes 2`,
        no `--master_port`), which also shows torch's **default port 29500**: a second job on the same node
        with the same default collides (`EADDRINUSE`, lesson 06). With `--nnodes 1` and no port, torch ≥ 2.x
        picks a free port by itself (a c10d rendezvous on `localhost:0`); `%%ddp` always picks a free one.
        """),
        code("""
        import os, subprocess, sys
        os.makedirs("runs/02", exist_ok=True)
        with open("runs/02/old_parser.py", "w") as f:
            f.write("import argparse, os\\n"
                    "print('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\\n"
                    "parser = argparse.ArgumentParser()\\n"
                    "parser.add_argument('--local_rank', type=int, default=-1)   # the articles' parser\\n"
                    "print(parser.parse_args())\\n")
        launch = [sys.executable, "-m", "torch.distributed.launch", "--nnodes", "2", "--nproc-per-node", "1",
                  "--master-addr", "127.0.0.1"]
        nodes = [subprocess.Popen(launch + ["--node-rank", str(i), "runs/02/old_parser.py"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(2)]
        real_launch = [node.communicate(timeout=120)[0] for node in nodes]
        for line in real_launch[0].splitlines():
            if line.startswith(("MASTER_PORT", "old_parser.py: error")) or "deprecated" in line:
                print(line.split(": ", 1)[1] if "FutureWarning" in line else line)   # the warning without its path
        """),
        md("""
        The same script under `torchrun` gets no such argument at all — `args.local_rank` stays `-1`. And
        `torch.cuda.set_device(-1)` does **not** fail: torch documents a negative device as a no-op, so every rank
        silently stays on the default device, `cuda:0` — all ranks on GPU 0, the articles' first cause of
        out-of-memory. That is the usual migration bug; `set_device(-1)` runs even here, without a GPU:
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull parsed -- --lr 0.1
        import argparse, os, sys, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=-1)
        parser.add_argument("--lr", type=float)
        args = parser.parse_args()
        torch.cuda.set_device(args.local_rank)        # -1: a silent no-op, no error
        parsed = {"args.local_rank": args.local_rank, "LOCAL_RANK": int(os.environ["LOCAL_RANK"])}
        print(f"argv={sys.argv[1:]} -> {parsed}; set_device({args.local_rank}) raised nothing")
        """),
        code("""
        for rank, p in enumerate(parsed):
            assert p == {"args.local_rank": -1, "LOCAL_RANK": rank}, p
        if any("EADDRINUSE" in out for out in real_launch):   # another job holds 29500 right now: the collision itself
            print("port 29500 is taken on this machine at the moment: exactly the default-port collision above")
        else:
            assert all("MASTER_PORT 29500" in out for out in real_launch), real_launch
            assert all("unrecognized arguments: --local-rank=" in out for out in real_launch), real_launch
        print("torch 2.x's launcher passes --local-rank=N, torchrun passes nothing; LOCAL_RANK is in the environment")
        """),
        md("""
        ### Migration `torch.distributed.launch` → `torchrun`

        | before | after |
        |---|---|
        | `python -m torch.distributed.launch --nproc_per_node=4 train.py` | `torchrun --nproc_per_node=4 train.py` |
        | `... launch --use_env ...` (variables instead of argv) | the default in torchrun |
        | `parser.add_argument("--local_rank", type=int)`; `args.local_rank` | `local_rank = int(os.environ["LOCAL_RANK"])` |
        | `--master_addr`, `--master_port`, `--nnodes`, `--node_rank` | the same options (torchrun also offers `--rdzv-endpoint`) |
        | a failed rank: the others hang or are killed | torchrun stops all, writes the error file, can `--max-restarts` |
        """),
        md("## Check"),
        code("""
        must = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE"}
        assert must <= local_keys, must - local_keys
        assert local_keys == set(torchrun_env), (local_keys ^ set(torchrun_env))
        assert envs[0]["WORLD_SIZE"] == str(world_size) and envs[0]["RANK"] == "0"
        if world_size > 1:
            assert envs[0]["OMP_NUM_THREADS"] == "1"
        print("ok: %%ddp gives each rank the same variables as torchrun")
        """),
        md("""
        ## Exercise
        Write an argument parser that works under **both** launchers: it accepts `--local_rank` / `--local-rank`
        when the old launcher passes it, and otherwise falls back to `LOCAL_RANK` from the environment. Run it with
        `--legacy-launch` and without.
        """),
        md("### Solution"),
        code("""
        both_ways = '''
        import argparse, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
        args = parser.parse_args()
        print(f"local_rank={args.local_rank}")
        '''
        results = []
        for line in (f"-n {world_size} --legacy-launch", f"-n {world_size} --legacy-launch underscore", f"-n {world_size}"):
            get_ipython().run_cell_magic("ddp", line + " --output text --timeout 60", both_ways)
            results.append(_ddp)
        """, "solution"),
        code("""
        for res in results:
            for r in res.ranks:
                assert f"local_rank={r.local_rank}" in r.stdout
        print("the parser works with --local-rank=N, --local_rank=N and with LOCAL_RANK only")
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 03
@lesson("03_p2p_and_collectives")
def _03():
    return [
        md("""
        # 03 · Point-to-point and collective communication (点对点通信与集合通信)

        **Point-to-point**: one rank sends, one named rank receives (`send`/`recv`, non-blocking `isend`/`irecv`).
        **Collectives** (集合通信): *every* rank of the group calls the same function, and data moves among all:

        | call | before → after |
        |---|---|
        | `broadcast(t, src)` | `src`'s tensor is copied to every rank |
        | `reduce(t, dst, op)` | `dst` gets the sum (or max, …) of all ranks' tensors; on the other ranks `t` is undefined afterwards |
        | `all_reduce(t, op)` | **every** rank gets the sum — what DDP does with gradients |
        | `gather(t, list, dst)` | `dst` gets a list with every rank's tensor |
        | `all_gather(list, t)` | every rank gets that list |
        | `scatter(t, list, src)` | `src` hands piece *i* of its list to rank *i* |
        | `barrier()` | nobody continues until everybody has arrived |
        """),
        params("world_size = 2"),
        code(LOAD),
        md("## 1 · send / recv: pass a token around the ring 0 → 1 → … → 0"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull token
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
        """),
        code("""
        assert token[0].item() == (world_size if world_size > 1 else 0), token      # --pull token: one per rank
        """),
        md("## 2 · All the collectives, each rank starting from `rank + 1`"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull got
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
        dist.scatter(piece, scatter_list=[torch.tensor([10.0 * i]) for i in range(world)] if rank == 0 else None, src=0)
        show("scatter", piece.tolist())
        dist.barrier();                                                          show("barrier", "everyone got here")
        dist.destroy_process_group()
        """),
        code("""
        total = world_size * (world_size + 1) / 2      # `--pull got`: each rank's results, indexed by rank
        assert got[0]["reduce"] == [total] and all("reduce" not in g for g in got[1:])
        assert all(g["all_reduce"] == [total] and g["broadcast"] == [1.0] for g in got)
        assert all(g["all_gather"] == [float(i + 1) for i in range(world_size)] for g in got)
        assert [g["scatter"] for g in got] == [[10.0 * i] for i in range(world_size)]
        print("collectives behave as the table says")
        """),
        md("""
        ## 3 · An all-reduce written by hand: the ring (环形 all-reduce)
        NCCL and gloo implement `all_reduce` so that each rank sends only about 2× its data, whatever the number of
        ranks. The **ring** algorithm: split the tensor into `world` chunks; then
        1. **reduce-scatter**: `world-1` steps; each rank sends one chunk to its right neighbour, receives one from
           its left and adds it. Afterwards rank *r* holds the complete sum of chunk *(r+1) mod world*;
        2. **all-gather**: `world-1` more steps passing the finished chunks around, until everyone has all of them.

        We run it on a random tensor and compare with `dist.all_reduce`.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull err
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
        """),
        md("## Check"),
        code("""
        errs = err                                   # --pull err: one number per rank
        assert len(errs) == world_size and max(errs) < 1e-4, errs
        print("ok: the hand-written ring all-reduce equals dist.all_reduce on every rank; max error", max(errs))
        """),
        md("""
        ## Exercise
        Write `ring_all_gather(t)` using only `isend`/`recv` (each rank contributes one tensor; afterwards every
        rank has the list of all of them, in rank order) and check it against `dist.all_gather`.
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull same
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
        """, "solution"),
        code("""
        assert same == [True] * world_size, same
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 04
@lesson("04_single_device_to_ddp")
def _04():
    return [
        md("""
        # 04 · From a single-device script to DDP (从单卡到 DistributedDataParallel)

        First a plain training script on one device. Then the same script made distributed, step by step:
        1. read `LOCAL_RANK` from the environment (argparse default), not from a launcher argument;
        2. `torch.cuda.set_device(local_rank)` — **only with GPUs**, and **before** `init_process_group`: NCCL
           creates its communicator on the current device, so a rank that binds later has already put a CUDA
           context on GPU 0 (the articles call `set_device` afterwards; with several ranks that is every rank
           holding memory on GPU 0). Since torch 2.3 `init_process_group(..., device_id=...)` says it explicitly;
        3. `dist.init_process_group(backend, init_method="env://")` — rank, world size and meeting point come from
           the variables the launcher set;
        4. wrap the model: `DDP(model, device_ids=[local_rank])` (no `device_ids` on CPU); DDP copies rank 0's
           weights to every rank here, and averages gradients over ranks during `backward()`;
        5. `DistributedSampler` gives each rank its own part of the data; `sampler.set_epoch(epoch)` reshuffles;
        6. save the checkpoint — model **and optimizer** — **on rank 0 only**, then `dist.barrier()` so nobody
           reads it before it exists;
        7. `dist.destroy_process_group()` at the end.
        """),
        params("""
        world_size = 2
        epochs = 2
        out_dir = "runs/04"
        """),
        code(LOAD),
        md("""
        ## 1 · The single-device version (runs in the notebook itself)
        Its sampler is `DistributedSampler` with one replica: the same shuffle the DDP version's sampler makes, so
        the two runs below see the same samples in the same order and their losses can be compared number for
        number. (With `shuffle=True` in a `DataLoader` the orders differ, and so do the losses, a little.)
        """),
        code("""
        import torch
        from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

        def make_data():
            g = torch.Generator().manual_seed(0)
            X = torch.randn(512, 8, generator=g)
            y = X @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(512, 1, generator=g)
            return TensorDataset(X, y)

        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        data = make_data()
        order = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)   # one replica: all of it
        loader = DataLoader(data, batch_size=32, sampler=order)
        single_losses = []
        for epoch in range(epochs):
            order.set_epoch(epoch)
            total, count = 0.0, 0
            for xb, yb in loader:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                loss.backward(); opt.step()
                total += loss.item() * len(xb); count += len(xb)
            single_losses.append(total / count)
            print(f"epoch {epoch}: loss {total / count:.4f}")
        """),
        md("""
        ## 2 · The DDP version, run as a script with arguments
        Everything after `--` becomes `sys.argv[1:]`, as `torchrun train.py --epochs 2` would give. The cell is
        a complete script: `%ddp_export` can write it to a file for torchrun (cell below). `--pull` brings a few
        of its variables back to the notebook for the check; `--timeout` ends it if it ever hangs.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull losses@0,before_wrap,after_wrap,keys -- --epochs $epochs --out $out_dir
        import argparse, os
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

        def make_data():
            g = torch.Generator().manual_seed(0)
            X = torch.randn(512, 8, generator=g)
            y = X @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(512, 1, generator=g)
            return TensorDataset(X, y)

        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=1)
        parser.add_argument("--lr", type=float, default=0.02)
        parser.add_argument("--out", default="runs")
        parser.add_argument("--local-rank", "--local_rank", type=int,                  # (1)
                            default=int(os.environ.get("LOCAL_RANK", 0)))
        args = parser.parse_args()

        use_cuda = torch.cuda.is_available()
        if use_cuda:                                                                    # (2) GPU only, first
            torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")   # (3)
        rank, world = dist.get_rank(), dist.get_world_size()

        torch.manual_seed(rank)                  # different on purpose: DDP(...) copies rank 0's weights to all
        model = torch.nn.Linear(8, 1).to(device)
        before_wrap = model.weight.sum().item()
        model = DDP(model, device_ids=[args.local_rank] if use_cuda else None)         # (4)
        after_wrap = model.module.weight.sum().item()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

        data = make_data()
        sampler = DistributedSampler(data, shuffle=True, seed=0)                        # (5)
        loader = DataLoader(data, batch_size=32 // world, sampler=sampler)             # same global batch
        losses = []
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)                     # a different shuffle every epoch
            stats = torch.zeros(2, device=device)
            for xb, yb in loader:
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                loss.backward()                          # DDP all-reduces the gradients here
                opt.step()
                stats += torch.tensor([loss.item() * len(xb), len(xb)], device=device)
            dist.all_reduce(stats)                       # loss over all ranks' samples
            losses.append((stats[0] / stats[1]).item())
            if rank == 0:
                print(f"epoch {epoch}: loss {losses[-1]:.4f} ({int(stats[1])} samples)")

        keys = {"model.state_dict()": list(model.state_dict()), "model.module.state_dict()": list(model.module.state_dict())}
        if rank == 0:                                                                   # (6)
            os.makedirs(args.out, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epochs": args.epochs},
                       f"{args.out}/ckpt.pt")
        dist.barrier()                                   # rank 0 has written it before anyone goes on
        ckpt = torch.load(f"{args.out}/ckpt.pt", map_location=device)
        print(f"rank {rank}: loaded checkpoint of epoch {ckpt['epochs']}, weight sum "
              f"{model.module.weight.sum().item():.6f}")
        dist.destroy_process_group()                                                    # (7)
        """),
        code("""
        %ddp_export $out_dir/train_ddp.py
        """),
        md("""
        **`model.module`.** DDP wraps your model: its `state_dict()` names every tensor `module.…`
        (`keys` above). Save `model.module.state_dict()` so the file loads into a plain model — on one GPU, for
        inference, or before the next `DDP(...)`; a `module.`-prefixed file does not:
        """),
        code("""
        print(keys[0])
        plain = torch.nn.Linear(8, 1)
        try:
            plain.load_state_dict({"module.weight": plain.weight.data, "module.bias": plain.bias.data})
            raise AssertionError("expected a key mismatch")
        except RuntimeError as exc:
            prefix_error = str(exc).splitlines()[0] + " " + str(exc).splitlines()[1].strip()
        print(prefix_error)
        """),
        md("""
        ## 3 · Which GPU each rank gets
        With GPUs, rank *r* of a node uses `cuda:LOCAL_RANK`, so a node can run at most as many ranks as it has
        GPUs (`nproc_per_node ≤ GPUs`): NCCL refuses two ranks on one GPU ("Duplicate GPU detected") and
        `set_device` past the last GPU is `invalid device ordinal`. Schedulers choose GPUs with
        `CUDA_VISIBLE_DEVICES`: a rank sees only those, renumbered from 0, so `cuda:LOCAL_RANK` still works.
        `%%ddp --gpus 1,3` does the same. nbddp's placement rules are plain functions of the GPU count, so they
        can be shown on this CPU machine for an imagined node with 4 GPUs:
        """),
        code("""
        from nbddp import DDPUsageError
        from nbddp.core.spec import make_spec
        from nbddp.core.placement import plan
        for line, gpus in (("-n 4", None), ("-n 2 --gpus 1,3", (1, 3))):
            p = plan(make_spec(n=4 if gpus is None else 2, gpus=gpus), device_count=4)
            seen = dict(p.env).get("CUDA_VISIBLE_DEVICES", "all 4")
            for local in range(len(p.devices)):
                print(f"%%ddp {line:16} local rank {local}: CUDA_VISIBLE_DEVICES={seen:6} -> {p.device_of(local)} "
                      f"= physical GPU {p.physical[local]}, backend {p.backend}")
        print("-n 8 --backend auto on 4 GPUs:", plan(make_spec(n=8), device_count=4).note)
        try:
            plan(make_spec(n=8, backend="nccl"), device_count=4)
        except DDPUsageError as exc:   # a ValueError; %%ddp shows it as a UsageError
            too_many = str(exc)
        print("-n 8 --backend nccl on 4 GPUs:", too_many)
        """),
        md("## Check"),
        code("""
        import os
        assert _ddp.ok
        assert len(losses) == epochs and losses[-1] < losses[0], losses
        assert max(abs(a - b) for a, b in zip(losses, single_losses)) < 1e-3, (losses, single_losses)  # same numbers
        if world_size > 1:
            assert len(set(before_wrap)) == world_size, before_wrap          # each rank made different weights ...
        assert set(after_wrap) == {before_wrap[0]}, after_wrap               # ... and DDP gave all of them rank 0's
        assert keys[0]["model.state_dict()"] == ["module.weight", "module.bias"] and "Missing key" in prefix_error
        ckpt = torch.load(f"{out_dir}/ckpt.pt")
        assert ckpt["optimizer"]["state"][0]["momentum_buffer"].shape == (1, 8)   # momentum saved with the model
        assert os.path.exists(f"{out_dir}/train_ddp.py")
        assert "nccl needs one GPU per rank" in too_many
        print("ok: DDP losses", [round(l, 4) for l in losses], "= single device", [round(l, 4) for l in single_losses],
              "(same samples, same order, same global batch of 32)")
        """),
        md("""
        ## Exercise
        Resume training: start a second job that loads `ckpt.pt` on every rank **before** wrapping with DDP, and
        restores the optimizer too (its momentum is part of the training state: without it the next steps differ
        from an uninterrupted run), trains one more epoch, and prints the loss.
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull resumed@0 -- --out $out_dir
        import argparse, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import TensorDataset, DataLoader, DistributedSampler
        args = argparse.ArgumentParser(); args.add_argument("--out"); args = args.parse_args()
        dist.init_process_group("gloo")
        g = torch.Generator().manual_seed(0)
        X = torch.randn(512, 8, generator=g); y = X @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(512, 1, generator=g)
        data = TensorDataset(X, y)
        model = torch.nn.Linear(8, 1)
        ckpt = torch.load(f"{args.out}/ckpt.pt")
        model.load_state_dict(ckpt["model"])
        model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        opt.load_state_dict(ckpt["optimizer"])               # momentum buffers, as they were
        sampler = DistributedSampler(data, seed=0); sampler.set_epoch(ckpt["epochs"])
        stats = torch.zeros(2)
        for xb, yb in DataLoader(data, batch_size=32 // dist.get_world_size(), sampler=sampler):
            opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(xb), yb); loss.backward(); opt.step()
            stats += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(stats)
        resumed = (stats[0] / stats[1]).item()
        if dist.get_rank() == 0:
            print(f"resumed epoch {ckpt['epochs']}: loss {resumed:.4f}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert resumed < losses[-1], (resumed, losses)
        print("resumed loss", resumed)
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 05
@lesson("05_sharding_and_metrics")
def _05():
    return [
        md("""
        # 05 · Sharding and metrics (数据分片与指标同步)

        `DistributedSampler` splits a data set over the ranks: rank *r* gets indices `r, r+world, r+2·world, …`
        (after an optional shuffle that is the same on every rank for a given `seed` and epoch).
        When the length does not divide evenly:
        - `drop_last=False` (default): the list is **padded** by repeating the first indices, so every rank gets
          `ceil(N / world)` samples — some samples are seen twice;
        - `drop_last=True`: the tail is **dropped**, every rank gets `floor(N / world)`.

        Equal shard sizes matter: every rank must do the same number of steps, or the DDP all-reduces do not pair
        up and the job hangs.
        """),
        params("""
        world_size = 2
        N = 11
        """),
        code(LOAD),
        md("## 1 · Who gets which index"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull rows,shuffled -- $N
        import os, sys
        from torch.utils.data import DistributedSampler
        N = int(sys.argv[1])
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        rows, shuffled = [], []
        for drop_last in (False, True):       # num_replicas/rank given: no process group needed
            s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
            rows.append({"drop_last": drop_last, "rank": rank, "indices": list(s)})
        s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=0)
        for epoch in (0, 1):
            s.set_epoch(epoch)
            shuffled.append({"epoch": epoch, "rank": rank, "indices": list(s)})
        """),
        code("""
        import math
        rows = [row for per_rank in rows for row in per_rank]            # --pull: one list per rank, joined
        shuffled = [row for per_rank in shuffled for row in per_rank]
        for row in sorted(rows, key=lambda r: (r["drop_last"], r["rank"])):
            print(f"drop_last={row['drop_last']!s:5}  rank {row['rank']}: {row['indices']}")
        for row in sorted(shuffled, key=lambda r: (r["epoch"], r["rank"])):
            print(f"shuffle epoch {row['epoch']}  rank {row['rank']}: {row['indices']}")
        """),
        code("""
        padded = [i for r in rows if not r["drop_last"] for i in r["indices"]]
        dropped = [i for r in rows if r["drop_last"] for i in r["indices"]]
        assert all(len(r["indices"]) == math.ceil(N / world_size) for r in rows if not r["drop_last"])
        assert set(padded) == set(range(N)) and len(padded) - N == math.ceil(N / world_size) * world_size - N
        assert all(len(r["indices"]) == N // world_size for r in rows if r["drop_last"]) and len(set(dropped)) == len(dropped)
        for epoch in (0, 1):   # each epoch: a partition of all indices, and a different one per epoch
            assert set(i for r in shuffled if r["epoch"] == epoch for i in r["indices"]) == set(range(N))
        e0 = {r["rank"]: r["indices"] for r in shuffled if r["epoch"] == 0}
        e1 = {r["rank"]: r["indices"] for r in shuffled if r["epoch"] == 1}
        assert e0 != e1, "set_epoch changes the order"
        print(f"padding repeated {len(padded) - N} sample(s); drop_last dropped {N - len(dropped)}")
        """),
        md("""
        ## 2 · Validation metrics: rank 0 alone is wrong
        Each rank evaluates only its shard. Printing rank 0's accuracy reports **a part** of the data. Sum the
        counts with `all_reduce` instead — and for exact numbers, evaluate an *unpadded* split (uneven is fine for
        evaluation: one all-reduce at the end, not one per step).

        Here sample *i* is predicted correctly unless `i % 4 == 0`.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull got@0 -- $N
        import sys, torch, torch.distributed as dist
        from torch.utils.data import DistributedSampler
        dist.init_process_group("gloo")
        N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
        correct = lambda idx: torch.tensor([float(i % 4 != 0) for i in idx])

        padded = list(DistributedSampler(range(N), shuffle=False))         # the training sampler, reused
        exact = list(range(rank, N, world))                                # unpadded, uneven split
        c = correct(padded)
        got = {"RANK0_ONLY": c.mean().item()}                               # what rank 0 alone would report
        stats = torch.tensor([c.sum().item(), len(padded)]); dist.all_reduce(stats)
        got["ALLREDUCE_PADDED"] = (stats[0] / stats[1]).item()
        stats = torch.tensor([correct(exact).sum().item(), len(exact)]); dist.all_reduce(stats)
        got["ALLREDUCE_EXACT"] = (stats[0] / stats[1]).item()
        if rank == 0: print(got, f"(exact split: {int(stats[1])} samples)")
        dist.destroy_process_group()
        """),
        md("## Check"),
        code("""
        truth = sum(i % 4 != 0 for i in range(N)) / N
        assert abs(got["ALLREDUCE_EXACT"] - truth) < 1e-6, (got, truth)
        if world_size > 1:
            assert abs(got["RANK0_ONLY"] - truth) > 1e-3, "rank 0 alone saw only part of the data"
        if N % world_size:
            assert abs(got["ALLREDUCE_PADDED"] - truth) > 1e-3, "padding counted repeated samples twice"
        print(f"true accuracy {truth:.4f}; rank 0 only {got['RANK0_ONLY']:.4f}; all_reduce over padded shards "
              f"{got['ALLREDUCE_PADDED']:.4f}; all_reduce over an exact split {got['ALLREDUCE_EXACT']:.4f}")
        """),
        md("""
        ## Exercise
        Average a **loss** over ranks whose shards have different sizes (`range(rank, N, world)`). Why is
        `all_reduce(mean_loss) / world` wrong, and what is right? Compute both against the true mean of `(i * 0.1) ** 2`
        over `i < N`.
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull naive@0,weighted@0 -- $N
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
        losses = torch.tensor([(i * 0.1) ** 2 for i in range(rank, N, world)])
        naive = losses.mean().clone(); dist.all_reduce(naive); naive = naive.item() / world   # mean of means: wrong weights
        s = torch.tensor([losses.sum().item(), float(len(losses))]); dist.all_reduce(s)      # sum and count: right
        weighted = (s[0] / s[1]).item()
        if rank == 0:
            print(f"naive {naive:.6f} weighted {weighted:.6f}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        true_mean = sum((i * 0.1) ** 2 for i in range(N)) / N
        assert abs(weighted - true_mean) < 1e-5
        if N % world_size:
            assert abs(naive - true_mean) > 1e-4
        print("naive", naive, "weighted", weighted, "true", true_mean)
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 06
@lesson("06_pitfalls")
def _06():
    return [
        md("""
        # 06 · Pitfalls, reproduced (常见错误复现)

        Mistakes everybody makes once. Each is reproduced on purpose here, caught, and checked, so you recognise
        the message when it happens for real — first as plain torch reports it (a subprocess with plain `python`,
        or the cell under real torchrun), then as `%%ddp` does, which stops some of them earlier.
        """),
        params("""
        world_size = 2
        hang_timeout = 5
        """),
        code(LOAD),
        md("""
        ## 1 · `env://` without a launcher: `MASTER_ADDR expected, but not set`
        `init_process_group` with the default `env://` reads `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`.
        Run the script with plain `python` (here: a subprocess, not under nbddp) and they are missing.
        """),
        code("""
        import os, subprocess, sys
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        script = "import torch.distributed as dist\\ndist.init_process_group('gloo', init_method='env://')"
        plain = subprocess.run([sys.executable, "-c", script], env=clean, capture_output=True, text=True)
        print("exit code", plain.returncode, "|", plain.stderr.strip().splitlines()[-1])
        # the usual half-fix: rank and world size set by hand, the meeting point forgotten
        half = subprocess.run([sys.executable, "-c", script], env=dict(clean, RANK="0", WORLD_SIZE="1"),
                              capture_output=True, text=True)
        print("exit code", half.returncode, "|", half.stderr.strip().splitlines()[-1])
        """),
        code("""
        assert plain.returncode != 0 and "environment variable RANK expected, but not set" in plain.stderr
        assert "environment variable MASTER_ADDR expected, but not set" in half.stderr
        """),
        md("**Fix**: start it with `torchrun` (or `%%ddp`), which sets all four; or set them yourself."),
        md("""
        ## 2 · A collective inside `if rank == 0:` — the hang
        A collective must be called by **every** rank. Below only rank 0 calls `all_reduce`; rank 1 goes on to the
        `barrier`. Neither can finish: a hang, with no error message at all. `--timeout` stops it and shows
        **where each rank is blocked** (nbddp asks each rank for its Python stack before stopping it).
        """),
        code("""
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
        """),
        code("""
        assert timed_out.timed_out and all(r.state == "timed out" for r in timed_out.ranks)
        assert "all_reduce" in timed_out.ranks[0].blocked_at
        if world_size > 1:
            assert "barrier" in timed_out.ranks[1].blocked_at
            assert "not all in the same collective" in timed_out.notes[-1]
        assert "all_reduce" in timed_out.ranks[0].stack          # the full Python stack of the rank
        """),
        md("""
        **Fix**: every rank calls the collective; only the *use* of the result is rank-dependent:
        `dist.all_reduce(t)` then `if rank == 0: print(t)`.

        ## 3 · Port conflict: `MASTER_PORT` already taken
        Another job (or a crashed one) still holds the port — most often torch's **default, 29500**: `torchrun`
        with `--nnodes` > 1 and no `--master-port` uses it, and so do the articles' examples, so two such jobs on
        one machine collide. What torch itself does: rank 0 tries to host the store on that port and fails with
        `EADDRINUSE` (run for real below, plain `python`, no nbddp). `%%ddp` checks the port before starting
        anything and says so in one line.
        """),
        code("""
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
        """),
        code("""
        assert torch_itself.returncode != 0 and "EADDRINUSE" in torch_itself.stderr
        assert f"MASTER_PORT {busy_port} is already in use" in port_error
        """),
        md("""
        **Fix**: pick another port, or leave `--master-port` out (`%%ddp` picks a free one per launch; with torchrun
        `--standalone` or `--rdzv-endpoint localhost:0` do the same).

        ## 4 · A multi-node configuration that does not add up
        `WORLD_SIZE` must be `nnodes × nproc_per_node`. 4 processes cannot be spread evenly over 3 machines, and
        asking for 4 ranks while saying 3 per node on 2 nodes (= 6) contradicts itself.
        """),
        code("""
        config_errors = {}
        for line in ("-n 4 --nnodes 3", "-n 4 --nproc-per-node 3 --nnodes 2"):
            try:
                get_ipython().run_cell_magic("ddp", line + " --timeout 60", "print('never runs')")
            except UsageError as exc:
                config_errors[line] = str(exc)
                print(f"%%ddp {line}\\n    -> {exc}")
        """),
        md("""
        With real machines the same mistake does not fail fast: node 0 says `--nnodes 2`, node 1 is never started
        (or says `--nnodes 3`), and rank 0 **waits at the rendezvous** for processes that never come. Here is node 0
        of a 2-node job alone, with a short timeout instead of the default 30 minutes:
        """),
        code("""
        lonely = '''
        import datetime, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
        '''
        env = dict(clean, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy_port))
        alone = subprocess.run([sys.executable, "-c", lonely], env=env, capture_output=True, text=True, timeout=60)
        print("exit code", alone.returncode, "|", alone.stderr.strip().splitlines()[-1][:300])
        """),
        md("""
        ## 5 · A tutorial's own `setup()`: hangs under torchrun, runs under `%%ddp`
        PyTorch's DDP tutorial starts each process with its own meeting point and numbers:
        `os.environ["MASTER_PORT"] = "12355"` then `init_process_group("gloo", rank=rank, world_size=world_size)`
        (or `init_method="tcp://127.0.0.1:12355"`). Under `torchrun --standalone` that code **hangs**: torchrun tells
        its ranks `TORCHELASTIC_USE_AGENT_STORE=True` ("the launcher hosts the store"), so rank 0 too waits as a
        client on a port no one serves. `%%ddp` sets the same variable, but uses its own store only when the cell
        aims at it; aimed elsewhere, rank 0 hosts the store as in a plain script, and the cell runs. The same holds
        in processes a rank starts with `mp.spawn` (the tutorial's whole script in a `%%ddp -n 1` cell runs).
        First, what torch itself does: the cell under real torchrun (`--launcher torchrun`), stopped by `--timeout`.
        """),
        code("""
        with socket.socket() as s:                    # the tutorial's 12355 may be taken on a shared machine
            s.bind(("127.0.0.1", 0)); tutorial_port = s.getsockname()[1]
        tutorial = f'''
        import os, torch, torch.distributed as dist

        def setup(rank, world_size):
            os.environ["MASTER_ADDR"] = "localhost"
            os.environ["MASTER_PORT"] = "{tutorial_port}"
            dist.init_process_group("gloo", rank=rank, world_size=world_size)

        setup(int(os.environ["RANK"]), {world_size})
        t = torch.ones(1); dist.all_reduce(t)
        print("all_reduce over the tutorial's own rendezvous:", t.item())
        dist.destroy_process_group()
        '''
        try:
            get_ipython().run_cell_magic("ddp", f"-n {world_size} --launcher torchrun --timeout {4 * hang_timeout}", tutorial)
            raise AssertionError("expected torchrun's ranks to hang")
        except nbddp.DDPTimeout as exc:
            under_torchrun = exc.result
        for r in under_torchrun.ranks:
            print(f"under torchrun, rank {r.rank}: {r.state}; blocked at {r.blocked_at}")
        """),
        md("The same cell under `%%ddp`:"),
        code("""
        get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60", tutorial)
        own_rendezvous = _ddp
        """),
        md("""
        What cannot work on one machine fails at once, naming the line: an address that is not this machine's,
        a port another process holds, or a `world_size` other than the launch's. Plain torch does not fail there:
        with `world_size` one too many, the ranks wait for a rank that never comes, for the default 30 minutes.
        Run for real, plain `python` processes with the tutorial's `setup()`, left 5 s after every one of them has
        reached `init_process_group`:
        """),
        code("""
        import glob, time
        os.makedirs("runs/06", exist_ok=True)
        for f in glob.glob("runs/06/joining-*"):
            os.remove(f)
        too_big = ("import os\\nopen('runs/06/joining-' + os.environ['RANK'], 'w').close()   # 'I got this far'\\n"
                   + tutorial.replace(f", {world_size})", f", {world_size + 1})").replace(str(tutorial_port), str(busy_port)))
        procs = [subprocess.Popen([sys.executable, "-c", too_big], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=dict(clean, RANK=str(r)))
                 for r in range(world_size)]
        deadline = time.monotonic() + 120
        while len(glob.glob("runs/06/joining-*")) < world_size and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(5)
        still_waiting = [p.poll() is None for p in procs]
        for p in procs:
            p.kill()
        printed = [p.communicate()[0] for p in procs]
        print(f"plain torch, world_size={world_size + 1} with {world_size} processes: still waiting after 5 s:",
              still_waiting)
        """),
        md("`%%ddp` refuses the same cell at once:"),
        code("""
        try:
            get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60", tutorial.replace(f", {world_size})", f", {world_size + 1})"))
            raise AssertionError("expected a DDPError")
        except nbddp.DDPError as exc:
            wrong_size = exc.result
        failed = [r for r in wrong_size.ranks if r.state == "failed"][0]
        print(failed.cause, "\\nHint:", failed.hint)
        """),
        code("""
        assert under_torchrun.timed_out and any("init_process_group" in (r.stack or "") for r in under_torchrun.ranks), \\
            [r.stack for r in under_torchrun.ranks]
        assert all(still_waiting) and not any("rendezvous:" in out for out in printed), printed
        assert own_rendezvous.ok and all(f"rendezvous: {world_size:.1f}" in r.stdout for r in own_rendezvous.ranks)
        assert f"world_size={world_size + 1} (set at cell line 10: setup(" in failed.cause
        assert f"but this %%ddp launch has {world_size} ranks" in failed.cause and failed.hint
        """),
        md("## Check"),
        code("""
        assert "cannot be split evenly over --nnodes 3" in config_errors["-n 4 --nnodes 3"]
        assert "disagrees with --nproc-per-node 3 x --nnodes 2 = 6" in config_errors["-n 4 --nproc-per-node 3 --nnodes 2"]
        assert alone.returncode != 0 and ("timed out" in alone.stderr.lower() or "timeout" in alone.stderr.lower())
        print("ok: all four pitfalls reproduced and recognised")
        """),
        md("""
        ## Exercise
        Fix the hanging cell of section 2 so that it finishes, still printing the sum on rank 0 only.
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        t = torch.ones(1)
        dist.all_reduce(t)              # every rank
        if rank == 0:
            print(f"sum = {t.item():.0f}")  # only the printing depends on the rank
        dist.barrier()
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert _ddp.ok and f"sum = {world_size}" in _ddp.ranks[0].stdout
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 07
@lesson("07_multi_node")
def _07():
    return [
        md("""
        # 07 · Multi-node configuration (多机配置)

        On several machines you start **one launcher per machine**, each with the same job shape and its own
        `--node_rank`:

        | option | same on every node? | meaning |
        |---|---|---|
        | `--nnodes` | yes | number of machines |
        | `--nproc_per_node` | yes | processes (GPUs) per machine |
        | `--node_rank` | **no**: 0, 1, … | which machine this is |
        | `--master_addr` | yes | address of node 0, reachable from all nodes (not `localhost`!) |
        | `--master_port` | yes | a free port on node 0, open in the firewall |

        We cannot borrow a cluster, but `%%ddp --nnodes` runs all nodes' processes here with exactly the variables
        each would get on its own machine, and `nbddp.export` prints the commands you would type on each node.
        """),
        params("""
        nnodes = 2
        nproc_per_node = 1
        master_addr = "10.0.0.1"   # node 0 of an imaginary cluster
        master_port = 29500
        """),
        code(LOAD),
        md("## 1 · The commands, one per node"),
        code("""
        from nbddp.core.spec import make_spec
        from nbddp.export import node_commands
        spec = make_spec(nproc_per_node=nproc_per_node, nnodes=nnodes, master_addr=master_addr, master_port=master_port)
        commands = node_commands(spec, "train.py")
        for node, command in enumerate(commands):
            print(f"on node {node}:  {command}")
        """),
        md("""
        `%ddp_export` does the same for a real cell: it writes the cell as a script and prints the commands
        (section 3). Before torchrun, the same with the old launcher was
        `python -m torch.distributed.launch --nnodes=2 --node_rank=0 --nproc_per_node=… --master_addr=… --master_port=… train.py`.

        ## 2 · The job, simulated on this machine
        Each rank reports its node and local rank, and the job checks that communication works **across** nodes
        (a global all-reduce) and **inside** a node (a `new_group` with the node's ranks — how hierarchical schemes
        keep traffic on the fast local links).
        """),
        code("""
        %%ddp --nnodes $nnodes --nproc-per-node $nproc_per_node --timeout 60
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        node, local, per_node = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(world // per_node)]
        t = torch.tensor([float(rank)]); dist.all_reduce(t)                          # all nodes
        u = torch.tensor([float(rank)]); dist.all_reduce(u, group=groups[node])     # my node only
        print(f"node {node} local {local} rank {rank}: global sum {t.item():.0f}, node sum {u.item():.0f}")
        dist.destroy_process_group()
        """),
        md("## Check"),
        code("""
        import re
        world = nnodes * nproc_per_node
        assert len(_ddp.ranks) == world and _ddp.ok
        for r in _ddp.ranks:
            node, local = r.rank // nproc_per_node, r.rank % nproc_per_node
            node_sum = sum(range(node * nproc_per_node, (node + 1) * nproc_per_node))
            expect = f"node {node} local {local} rank {r.rank}: global sum {sum(range(world))}, node sum {node_sum}"
            assert expect in r.stdout, (expect, r.stdout)
            assert (r.node_rank, r.local_rank) == (node, local)
        assert len(commands) == nnodes and all(f"--node-rank={i}" in c for i, c in enumerate(commands))
        assert all(f"--master-addr={master_addr}" in c and f"--master-port={master_port}" in c for c in commands)
        print("ok: ranks, nodes and both groups are as configured")
        """),
        md("""
        ## 3 · Export the cell for the cluster
        """),
        code("""
        %%ddp_export runs/07/train_multinode.py --nnodes $nnodes --nproc-per-node $nproc_per_node --master-addr $master_addr --master-port $master_port
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1); dist.all_reduce(t)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {t.item():.0f}")
        dist.destroy_process_group()
        """),
        code("""
        script = open("runs/07/train_multinode.py").read()
        assert "dist.all_reduce(t)" in script and f"--node-rank={nnodes - 1}" in script
        print(script[-600:])
        """),
        md("""
        ## 4 · The same cell under Slurm
        Most clusters run jobs through Slurm. `--slurm` also writes a batch job next to the script: one task per
        node (`--ntasks-per-node=1`), each task a torchrun that starts the node's ranks, all meeting at a c10d
        rendezvous on the job's first node (`scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1`) with the
        job id as rendezvous id. `%ddp_export` without a cell exports the last `%%ddp` cell: section 2's.
        """),
        code("""
        %ddp_export runs/07/train_slurm.py --slurm --nnodes $nnodes --nproc-per-node $nproc_per_node --time 00:10:00
        """),
        code("""
        job = open("runs/07/train_slurm.sbatch").read()
        assert f"#SBATCH --nodes={nnodes}" in job and "srun " in job and '--rdzv-id="$SLURM_JOB_ID"' in job
        print(job)
        """),
        md("""
        On the cluster: `sbatch train_slurm.sbatch` (from the script's folder; `PYTHON=/path/to/env/bin/python` in
        front chooses the interpreter). From a notebook on the cluster's login node, or inside `salloc`,
        `%%ddp --launcher slurm --nnodes 2 -n 2` runs a cell on Slurm's nodes with the same live display and errors.
        Where this notebook finds Slurm (`sinfo`), the next cell runs section 2's cell so; elsewhere it says why not.
        """),
        code("""
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
        """),
        md("""
        ## Exercise
        The cluster has 2 machines with 4 GPUs each. Which `node_rank`, `LOCAL_RANK` (= which GPU) does global rank 5
        have? Verify by simulating the cluster with `%%ddp` and showing rank 5 only, and print node 1's command.
        """),
        md("### Solution"),
        code("""
        %%ddp --nnodes 2 --nproc-per-node 4 --ranks 5 --timeout 60
        import os
        print(f"rank {os.environ['RANK']}: node {os.environ['GROUP_RANK']}, cuda:{os.environ['LOCAL_RANK']}")
        """, "solution"),
        code("""
        assert "rank 5: node 1, cuda:1" in _ddp.ranks[5].stdout        # 5 = 1 x 4 + 1
        print(node_commands(make_spec(nproc_per_node=4, nnodes=2, master_addr=master_addr, master_port=master_port), "train.py")[1])
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 08
@lesson("08_no_sync_and_mixed_precision")
def _08():
    return [
        md("""
        # 08 · Gradient accumulation with `no_sync()`, and mixed precision (梯度累积与混合精度)

        **Accumulation** (梯度累积): a big batch does not fit, so run `k` micro-batches and step once. With DDP,
        every `backward()` all-reduces gradients — wasted for the first `k-1` micro-batches. Inside
        `with model.no_sync():` DDP only accumulates locally; the last `backward()` outside it syncs everything.
        The result must equal one step on the **whole global batch** — we check exactly that.

        Two things the article's accumulation loop leaves out, and this lesson adds:
        1. it calls `loss.backward()` on every micro-batch **without `no_sync()`**: correct numbers, but `k`
           all-reduces per step instead of one;
        2. it does **not divide the loss by `k`**: gradients add up over the micro-batches, so the step is `k`
           times too big (as if the learning rate were `k ×` larger). `loss / k` makes the sum the mean.

        And one the article's wording hides: the **forward** must run inside `no_sync()` too. DDP decides in
        `forward()` whether the coming backward synchronises; a forward outside with only `backward()` inside
        still all-reduces (section 1 measures it).

        **Mixed precision** (混合精度): on CPU, `torch.autocast("cpu", dtype=torch.bfloat16)` runs matmuls in
        bfloat16 while the weights stay float32. The classic recipe is fp16 + `GradScaler` (scales the loss so
        small fp16 gradients do not underflow); `torch.amp.GradScaler("cpu")` runs it here too (section 3).
        The article's `torch.cuda.amp.autocast()` / `torch.cuda.amp.GradScaler()` are deprecated: use
        `torch.autocast("cuda", ...)` and `torch.amp.GradScaler("cuda")`.
        """),
        params("""
        world_size = 2
        accum = 4
        """),
        code(LOAD),
        md("""
        ## 1 · `no_sync` gives the big-batch gradient, with one all-reduce instead of `accum`
        A DDP comm hook counts how often DDP all-reduces: it is called **once per gradient bucket** each time DDP
        synchronises (DDP packs gradients into buckets of `bucket_cap_mb`, 25 MB by default; this model fits in
        one, lesson 12 shows more). A plain copy of the model computes the big-batch gradient. Three ways to
        accumulate: `no_sync` around forward and backward, no `no_sync` at all (the article's loop, with the loss
        divided by `accum`), and `no_sync` around the backward only.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull results -- $accum
        import contextlib, copy, sys
        import torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        dist.init_process_group("gloo")
        rank, world, accum, micro = dist.get_rank(), dist.get_world_size(), int(sys.argv[1]), 8

        g = torch.Generator().manual_seed(1)
        X = torch.randn(world * accum * micro, 6, generator=g); Y = torch.randn(world * accum * micro, 1, generator=g)
        mine = slice(rank * accum * micro, (rank + 1) * accum * micro)     # this rank's part of the global batch

        def run(how):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            reference = copy.deepcopy(net)
            model = DDP(net)
            buckets = []
            def counting(state, bucket):
                buckets.append(bucket.index())
                return allreduce_hook(state, bucket)
            model.register_comm_hook(None, counting)
            Xr, Yr = X[mine], Y[mine]
            for i in range(accum):
                quiet = model.no_sync() if i < accum - 1 else contextlib.nullcontext()
                xb, yb = Xr[i * micro:(i + 1) * micro], Yr[i * micro:(i + 1) * micro]
                if how == "backward only in no_sync":
                    loss = F.mse_loss(model(xb), yb) / accum      # forward outside: DDP already decided to sync
                    with quiet:
                        loss.backward()
                else:
                    with quiet if how == "no_sync" else contextlib.nullcontext():
                        loss = F.mse_loss(model(xb), yb) / accum
                        loss.backward()
            F.mse_loss(reference(X), Y).backward()        # one step on the whole global batch, no DDP
            err = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.module.parameters(), reference.parameters()))
            return {"hook calls": len(buckets), "buckets": len(set(buckets)), "max grad diff": err}

        results = {how: run(how) for how in ("no_sync", "no no_sync", "backward only in no_sync")}
        for how, r in results.items():
            print(f"{how:25} {r}")
        dist.destroy_process_group()
        """),
        code("""
        for rank, per_how in enumerate(results):                  # --pull results: one dict per rank
            for how, r in per_how.items():
                print(f"rank {rank} {how:25}: {r['hook calls']} all-reduce call(s) over {r['buckets']} bucket(s), "
                      f"max |grad - big batch grad| = {r['max grad diff']:.1e}")
        """),
        md("""
        ## 2 · bfloat16 autocast on CPU
        The forward runs in bfloat16 under `autocast`; the loss is computed in float32 and gradients land on the
        float32 weights.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull amp
        import torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(dist.get_rank())
        X = torch.randn(256, 16, generator=g); y = X[:, :1] * 2
        losses = []
        for step in range(30):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(X)
            loss = F.mse_loss(out.float(), y)
            loss.backward(); opt.step()
            losses.append(loss.item())
        p = next(model.parameters())
        amp = {"out": str(out.dtype), "weights": str(p.dtype), "grads": str(p.grad.dtype), "first": losses[0], "last": losses[-1]}
        print(amp)
        dist.destroy_process_group()
        """),
        md("""
        ## 3 · fp16 + `GradScaler`, on CPU
        `GradScaler` multiplies the loss by a large scale (65536 at first) before `backward()`, divides the
        gradients by it before the step, and when a gradient is `inf`/`nan` **skips the step and halves the
        scale** (here the first steps overflow fp16 by themselves: the scale finds its level). One step below is
        given an infinite loss on purpose: the weights do not move and the scale halves.
        The deprecated spellings are called too, to show their warnings.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull scaled@0
        import warnings, torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = torch.amp.GradScaler("cpu")
        X = torch.randn(256, 16); y = X[:, :1] * 2
        scaled = {"scale at start": scaler.get_scale()}
        for step in range(20):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(model(X).float(), y)
            if step == 10:
                loss = loss * float("inf")               # an overflow, on purpose
                before = model.module.weight.detach().clone()
                scaled["scale before the inf step"] = scaler.get_scale()
            scaler.scale(loss).backward()                # scaled loss: fp16 grads do not underflow
            scaler.step(opt)                             # unscales; skips the step on inf/nan
            scaler.update()                              # and then halves the scale
            if step == 10:
                scaled["weights moved on the inf step"] = not torch.equal(before, model.module.weight)
                scaled["scale after the inf step"] = scaler.get_scale()
        scaled["last loss"] = loss.item()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.amp.GradScaler()
        scaled["deprecated"] = [str(w.message).split(" instead")[0] for w in caught if "deprecated" in str(w.message)]
        if dist.get_rank() == 0:
            print(scaled)
        dist.destroy_process_group()
        """),
        md("## 4 · CUDA: fp16 + GradScaler (runs only with one GPU per rank)"),
        code("""
        %%ddp -n $world_size --timeout 60
        import os, torch
        if not (torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])):
            print("skipped: needs one CUDA GPU per rank")
        else:
            import torch.distributed as dist, torch.nn.functional as F
            from torch.nn.parallel import DistributedDataParallel as DDP
            local = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local)
            dist.init_process_group("nccl")
            model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local])
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            scaler = torch.amp.GradScaler("cuda")
            X = torch.randn(256, 16, device="cuda"); y = X[:, :1] * 2
            for step in range(30):
                opt.zero_grad()
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = F.mse_loss(model(X).float(), y)
                scaler.scale(loss).backward()     # scaled loss: fp16 grads do not underflow
                scaler.step(opt)                  # unscales; skips the step on inf/nan
                scaler.update()
            print(f"fp16 loss {loss.item():.3f}, scale {scaler.get_scale():.0f}")
            dist.destroy_process_group()
        """),
        md("## Check"),
        code("""
        assert _ddp.ok and all(("skipped" in r.stdout) or ("fp16 loss" in r.stdout) for r in _ddp.ranks)
        for a in amp:
            assert (a["out"], a["weights"], a["grads"]) == ("torch.bfloat16", "torch.float32", "torch.float32"), a
            assert a["last"] < a["first"] / 2, a                                # bf16 autocast still trains
        for per_how in results:
            quiet, chatty, half = per_how["no_sync"], per_how["no no_sync"], per_how["backward only in no_sync"]
            assert all(r["max grad diff"] < 1e-5 for r in per_how.values()), per_how   # all equal the big batch
            assert quiet["buckets"] == 1 and quiet["hook calls"] == 1            # one bucket, synced once
            assert chatty["hook calls"] == accum * quiet["hook calls"], per_how  # no_sync saved accum-1 all-reduces
            assert half["hook calls"] == chatty["hook calls"], per_how           # forward outside no_sync: no saving
        assert scaled["scale at start"] == 65536.0, scaled
        assert scaled["scale after the inf step"] == scaled["scale before the inf step"] / 2, scaled      # halved
        assert not scaled["weights moved on the inf step"] and scaled["deprecated"], scaled
        print("ok: no_sync accumulation == big batch, with", results[0]["no_sync"]["hook calls"], "instead of",
              results[0]["no no_sync"]["hook calls"], "all-reduce calls; GradScaler skipped the overflowing step")
        """),
        md("""
        ## Exercise
        Accumulate over `accum` micro-batches with `no_sync()` **and** bfloat16 autocast, then check on every rank
        that the weights after the step are identical across ranks (`all_gather` a checksum).
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull identical -- $accum
        import contextlib, sys, torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank, world, accum = dist.get_rank(), dist.get_world_size(), int(sys.argv[1])
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(6, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for i in range(accum):
            ctx = model.no_sync() if i < accum - 1 else contextlib.nullcontext()
            with ctx:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(torch.randn(8, 6, generator=g))
                (out.float().pow(2).mean() / accum).backward()
        opt.step()
        checksum = torch.tensor([sum(p.sum().item() for p in model.parameters())])
        every = [torch.zeros(1) for _ in range(world)]; dist.all_gather(every, checksum)
        identical = all(torch.equal(e, every[0]) for e in every)
        print(f"replicas identical: {identical}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert all(identical), identical
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 09
@lesson("09_backends")
def _09():
    return [
        md("""
        # 09 · Backends: gloo, NCCL, MPI (通信后端)

        | backend | devices | when to use |
        |---|---|---|
        | **gloo** | CPU tensors (and CUDA for some ops, slowly) | CPU training, tests, a laptop; ships with every torch build |
        | **NCCL** | CUDA tensors only | GPU training — the fastest on NVIDIA GPUs (NVLink, InfiniBand); Linux + CUDA builds |
        | **MPI** | CPU (CUDA with a CUDA-aware MPI) | HPC clusters with an MPI installation; needs torch **built from source** with MPI |

        Rule of thumb: `"nccl"` for GPUs, `"gloo"` for CPU. `nbddp.backend()` returns exactly that (or what
        `%%ddp --backend` asked for).
        """),
        params("""
        world_size = 2
        reps = 7
        max_log2 = 20      # largest tensor: 2**20 floats = 4 MiB
        """),
        code(LOAD),
        md("## 1 · What this torch can do"),
        code("""
        import torch, torch.distributed as dist
        available = {
            "gloo": dist.is_gloo_available(),
            "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available(),
        }
        print("torch", torch.__version__, "| CUDA available:", torch.cuda.is_available(), "| GPUs:", torch.cuda.device_count())
        for name, ok in available.items():
            print(f"{name:5} built in: {ok}")
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull in_use
        import nbddp, torch.distributed as dist
        dist.init_process_group(nbddp.backend())
        in_use = dist.get_backend()
        print(f"rank {dist.get_rank()}: nbddp.backend() = {nbddp.backend()}, in use: {in_use}")
        dist.destroy_process_group()
        """),
        code("""
        chosen = "nccl" if torch.cuda.is_available() else "gloo"
        assert in_use == [chosen] * world_size, in_use
        """),
        md("""
        Asking for NCCL on a machine without it fails at once, with a hint (caught here on purpose):
        """),
        code("""
        import nbddp
        if not available["nccl"]:
            try:
                nbddp.run("import torch.distributed as dist\\ndist.init_process_group('nccl')\\n", n=world_size, timeout=60)
                raise AssertionError("expected an error")
            except nbddp.DDPError as exc:
                nccl_error = exc.result.failed[0]
            print(nccl_error.cause, "\\nhint:", nccl_error.hint)
            assert "NCCL" in nccl_error.cause and "gloo" in nccl_error.hint
        else:
            print("NCCL is available here")
        """),
        md("""
        ## 2 · Measured: gloo `all_reduce` time vs tensor size
        Small tensors cost a fixed latency; large ones are limited by bandwidth. (This is why DDP packs gradients
        into ~25 MB *buckets* instead of one all-reduce per parameter.)
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull rows@0 -- $reps $max_log2
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        reps, max_log2 = int(sys.argv[1]), int(sys.argv[2])
        rows = []
        for k in range(2, max_log2 + 1, 2):
            t = torch.ones(2 ** k)
            for _ in range(2):
                dist.all_reduce(t)                     # warm up
            best = float("inf")
            for trial in range(3):                     # best of 3: the run least disturbed by other work
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    dist.all_reduce(t)                 # back to back, as in a training step
                best = min(best, (time.perf_counter() - t0) / reps)
            rows.append([t.numel() * 4, best])
        dist.destroy_process_group()
        """),
        code("""
        import matplotlib.pyplot as plt
        sizes, secs = [r[0] for r in rows], [r[1] for r in rows]
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
        a.loglog(sizes, [s * 1e3 for s in secs], "o-"); a.set_xlabel("tensor size (bytes)"); a.set_ylabel("all_reduce time (ms)")
        a.set_title(f"gloo all_reduce, {world_size} ranks, CPU")
        b.semilogx(sizes, [n / s / 1e6 for n, s in zip(sizes, secs)], "o-", color="C1")
        b.set_xlabel("tensor size (bytes)"); b.set_ylabel("algorithm bandwidth (MB/s)"); b.set_title("size / time")
        fig.tight_layout(); plt.show()
        for n, s in rows:
            print(f"{n:>10,} B  {s * 1e3:8.3f} ms  {n / s / 1e6:9.1f} MB/s")
        """),
        md("## Check"),
        code("""
        assert available["gloo"] and len(rows) == len(range(2, max_log2 + 1, 2))
        assert all(s > 0 for s in secs)
        assert secs[-1] > min(secs), "the largest all-reduce is not the quickest"
        bw = [n / s for n, s in zip(sizes, secs)]
        assert bw[-1] > 10 * bw[0], "bandwidth grows with size: small messages are latency-bound"
        print(f"ok: latency {secs[0] * 1e6:.0f} us for 16 B; {bw[-1] / 1e6:.0f} MB/s at {sizes[-1] / 2**20:.0f} MiB")
        """),
        md("""
        ## Exercise
        Compare `broadcast` and `all_reduce` for a 1 MiB tensor. Which is faster, and why?
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull bcast@0,allred@0 -- $reps
        import statistics, sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        reps = int(sys.argv[1]); t = torch.ones(2 ** 18)      # 1 MiB
        def timed(fn):
            fn(); out = []
            for _ in range(reps):
                dist.barrier(); t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
            return statistics.median(out)
        bcast, allred = timed(lambda: dist.broadcast(t, 0)) * 1e3, timed(lambda: dist.all_reduce(t)) * 1e3
        if dist.get_rank() == 0:
            print(f"broadcast {bcast:.3f} ms, all_reduce {allred:.3f} ms")
            # broadcast only moves data one way; all_reduce also adds and sends results back (about 2x the traffic)
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert bcast > 0 and allred > 0
        print(f"broadcast {bcast} ms, all_reduce {allred} ms")
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 10
@lesson("10_monitoring_and_debugging")
def _10():
    return [
        md("""
        # 10 · Monitoring and debugging (监控与调试)

        With N processes there are N logs, N stacks, N profiles. Three habits:
        1. **log to one file per rank**, and to the screen at INFO on rank 0 only (warnings from every rank);
        2. **profile per rank** and look at communication (`all_reduce`) next to compute;
        3. when it breaks, match the symptom to the **cheat sheet** below and do its drill.
        """),
        params("""
        world_size = 2
        log_dir = "runs/10/logs"
        """),
        code(LOAD),
        md("""
        ## 1 · Per-rank log files, a per-rank log level on screen
        `logging` writes every rank to `rank{N}.log` at INFO. On the screen, rank 0 logs at INFO and the others
        at WARNING: one readable stream, and a problem on any rank still shows. (nbddp also keeps each rank's
        full stdout/stderr in `--log-dir`; `--ranks 0` shows only rank 0 in the notebook while all ranks run.)
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --log-dir $log_dir/nbddp -- $log_dir
        import logging, os, sys, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        os.makedirs(sys.argv[1], exist_ok=True)
        log = logging.getLogger("train")
        log.setLevel(logging.INFO)
        to_file = logging.FileHandler(f"{sys.argv[1]}/rank{rank}.log", mode="w")           # every rank, everything
        to_file.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s"))
        to_screen = logging.StreamHandler(sys.stdout)
        to_screen.setLevel(logging.INFO if rank == 0 else logging.WARNING)                  # the per-rank level
        to_screen.setFormatter(logging.Formatter(f"rank{rank} %(levelname)s %(message)s"))
        log.addHandler(to_file); log.addHandler(to_screen)
        model = DDP(torch.nn.Linear(32, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(5):
            opt.zero_grad(); loss = model(torch.randn(16, 32)).pow(2).mean(); loss.backward(); opt.step()
            log.info("step %d loss %.4f", step, loss.item())
        log.warning("done after %d steps", step + 1)                                       # every rank shows this
        dist.destroy_process_group()
        """),
        code("""
        import glob, os
        logs = sorted(glob.glob(f"{log_dir}/rank*.log"))
        print(logs)
        print(open(logs[-1]).read().splitlines()[-1])
        assert len(logs) == world_size and all(len(open(p).read().splitlines()) == 6 for p in logs)
        assert "rank0 INFO step 4" in _ddp.ranks[0].stdout
        assert all(r.stdout.strip() == f"rank{r.rank} WARNING done after 5 steps" for r in _ddp.ranks[1:])
        assert os.path.exists(_ddp.ranks[1].stdout_path) and _ddp.log_dir.startswith(os.path.abspath(log_dir))
        """),
        md("""
        ## 2 · The profiler, per rank: find the all-reduce
        `torch.profiler` inside each rank, as the article sets it up for training: a `schedule` (skip 1 step,
        warm up 1, record 2), `prof.step()` at the end of every step, and `tensorboard_trace_handler`, which
        writes each recorded window as a trace file per rank (`worker_name`) for TensorBoard's profiler plugin,
        Perfetto or `chrome://tracing`. DDP's gradient all-reduce shows up as `gloo:all_reduce` (NCCL:
        `nccl:all_reduce`) next to the compute ops. `--env KINETO_LOG_LEVEL=6` quiets the profiler library's
        own `profiler_start`/`profiler_stop` lines on stderr.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull comm -- $log_dir
        import sys, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.profiler import profile, schedule, tensorboard_trace_handler, ProfilerActivity
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                     on_trace_ready=tensorboard_trace_handler(f"{sys.argv[1]}/tb", worker_name=f"rank{rank}")) as prof:
            for step in range(4):
                opt.zero_grad(); model(torch.randn(64, 256)).pow(2).mean().backward(); opt.step()
                prof.step()                              # tells the schedule a step ended
        events = prof.key_averages()                      # the 2 recorded ("active") steps
        if rank == 0:
            print(events.table(sort_by="cpu_time_total", row_limit=8))
        comm = {"events": {e.key: e.count for e in events if "all_reduce" in e.key},
                "us": sum(e.cpu_time_total for e in events if "all_reduce" in e.key)}
        dist.destroy_process_group()
        """),
        code("""
        for rank, c in enumerate(comm):                   # --pull comm: one dict per rank
            print(f"rank {rank}: {c['events']}  ({c['us'] / 1e3:.2f} ms in all_reduce)")
        traces = sorted(os.path.basename(p).split(".")[0] for p in glob.glob(f"{log_dir}/tb/*.pt.trace.json"))
        print("trace files:", traces)
        """),
        md("""
        ## 3 · Error cheat sheet (错误速查表)

        | symptom | likely cause | what to do | drill |
        |---|---|---|---|
        | **OOM** (`CUDA out of memory`, `can't allocate memory`) | every rank on GPU 0 (`set_device` missing, after `init_process_group`, or `-1`: lesson 02, 04); batch too big *per rank*; rank 0 gathers everything | `torch.cuda.set_device(LOCAL_RANK)` first; lower the per-rank batch, accumulate (lesson 08), `bf16` | A |
        | **no speedup** with more ranks | no `DistributedSampler`: every rank trains on **all** the data; model too small: all-reduce dominates; ranks share cores (CPU) or one GPU | `DistributedSampler` + `set_epoch`; bigger per-rank work; profile (section 2) | B |
        | **wrong metrics** (accuracy differs with world size) | metric from rank 0's shard only; padded sampler counts repeats; mean of means | `all_reduce` sums and counts (lesson 05) | C |
        | **hang** (no output, 100 % or 0 % CPU) | a collective not called by all ranks, or in a different order; unequal number of batches | `--timeout` shows each rank's stack; `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch | D |
        | `MASTER_ADDR expected, but not set` | run with `python`, not a launcher | `torchrun` / `%%ddp` (lesson 06) | — |
        | `Address already in use` (`EADDRINUSE`) | a port still held by another job, often the default 29500 | another `--master-port`, or let it choose (lesson 06) | — |
        | `Distributed package doesn't have NCCL built in` | CPU-only torch | use gloo (lesson 09) | — |
        """),
        md("### Drill A · out of memory: a rank fails, the others are stopped, the cause is named"),
        code("""
        import nbddp
        try:
            get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60", "import torch\\nx = torch.empty(2**50)  # 4 PiB\\n")
            raise AssertionError("expected an error")
        except nbddp.DDPError as exc:
            oom = exc.result.failed[0]
        print(oom.describe())
        assert "can't allocate memory" in oom.cause and "cell line 3" in oom.cause   # line 1 is the %%ddp line
        """),
        md("""
        ### Drill B · no speedup: the forgotten `DistributedSampler`, and the cost of communication
        One epoch over 2048 samples, batch 64 per rank: on 1 rank; on `world_size` ranks **without** a
        `DistributedSampler` (the plain `DataLoader` gives every rank the whole data set: each rank does the
        single-rank epoch's work, and the job is no faster — only more copies); and with it. Each rank also times
        an all-reduce of its gradients, the communication DDP adds to every step. `nbddp.run(fn, n=...)` runs a
        function as a job and returns each rank's return value in `.values`.
        """),
        code("""
        def one_epoch(use_sampler):
            import time, torch, torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
            dist.init_process_group("gloo")
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(2048, 64), torch.randn(2048, 1))
            model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data) if use_sampler else None)
            seen, t0 = 0, time.perf_counter()
            for xb, yb in loader:
                opt.zero_grad(); torch.nn.functional.mse_loss(model(xb), yb).backward(); opt.step()
                seen += len(xb)
            epoch = time.perf_counter() - t0
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            times = []
            for _ in range(20):
                t0 = time.perf_counter(); dist.all_reduce(grads); times.append(time.perf_counter() - t0)
            del model, opt                 # DDP first, then its process group (a DDP freed after it can hang)
            dist.destroy_process_group()
            return {"samples": seen, "epoch_s": epoch, "all_reduce_ms": sorted(times)[10] * 1e3}

        runs = {}
        for label, n, use_sampler in (("1 rank", 1, True), (f"{world_size} ranks, no sampler", world_size, False),
                                      (f"{world_size} ranks + DistributedSampler", world_size, True)):
            runs[label] = nbddp.run(one_epoch, n=n, args=(use_sampler,), timeout=60, sinks=[]).values
        for label, values in runs.items():
            v = values[0]
            print(f"{label:34} rank 0: {v['samples']:5} samples, epoch {v['epoch_s']:.3f} s, "
                  f"all_reduce of the grads {v['all_reduce_ms']:.3f} ms (median)")
        """),
        code("""
        import matplotlib.pyplot as plt
        labels = list(runs)
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4))
        a.barh(labels, [runs[l][0]["samples"] for l in labels], color=["C0", "C3", "C2"])
        a.set_xlabel("samples each rank processes per epoch"); a.invert_yaxis()
        b.barh(labels, [runs[l][0]["epoch_s"] for l in labels], color=["C0", "C3", "C2"])
        b.set_xlabel("epoch time, rank 0 (s)"); b.invert_yaxis(); b.set_yticks([])
        fig.suptitle("Forgetting DistributedSampler: every rank repeats the whole epoch"); fig.tight_layout(); plt.show()
        """),
        code("""
        one, no_sampler, sampled = (runs[l] for l in labels)
        assert all(v["samples"] == 2048 for v in one + no_sampler), "without a sampler every rank sees all 2048"
        assert all(v["samples"] == 2048 // world_size for v in sampled), "with it, each rank sees its share"
        if world_size > 1:     # communication is not free: the same all-reduce costs more between processes
            assert min(v["all_reduce_ms"] for v in sampled) > one[0]["all_reduce_ms"], (one, sampled)
        """),
        md("### Drill C · wrong metrics: the metric depends on the world size"),
        code("""
        def metric():
            import torch, torch.distributed as dist
            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
            scores = torch.arange(10.0)[rank::world]                # this rank's shard of 10 samples
            s = torch.tensor([scores.sum().item(), float(len(scores))]); dist.all_reduce(s)
            dist.destroy_process_group()
            return {"this shard only": scores.mean().item(), "all_reduce": (s[0] / s[1]).item()}

        got = nbddp.run(metric, n=world_size, timeout=60).values[0]      # rank 0's return value
        wrong, right = got["this shard only"], got["all_reduce"]
        print("rank 0 only:", wrong, "| all_reduce:", right, "| true mean:", 4.5)
        assert right == 4.5 and (world_size == 1 or wrong != 4.5)
        """),
        md("### Drill D · a hang made loud: `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch"),
        code("""
        mismatch = '''
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1)
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
        '''
        if world_size > 1:
            try:
                nbddp.run(mismatch, n=world_size, timeout=30, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
                raise AssertionError("expected an error")
            except nbddp.DDPError as exc:
                bad = exc.result.failed[0]
            print(bad.describe()[:300], "\\nhint:", bad.hint)
            assert "mismatch between collectives" in bad.cause and "different collectives" in bad.hint
        """),
        md("## Check"),
        code("""
        assert len(comm) == world_size
        for c in comm:
            assert any(k.endswith("all_reduce") for k in c["events"]), c     # the profiler saw DDP's all-reduce
            assert c["us"] > 0
        assert traces == [f"rank{r}" for r in range(world_size)], traces   # one trace per rank, one active window
        assert not any("profiler_start" in line for r in _ddp.ranks for line in r.stderr.splitlines())
        print("ok: per-rank logs, per-rank profiles with the all-reduce, and the drills behaved as the cheat sheet says")
        """),
        md("""
        ## Exercise
        One rank is slow (it `sleep`s 0.2 s before each step). Profile all ranks: which rank shows **more** time
        in `all_reduce`, the slow one or the others? Why?
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --env KINETO_LOG_LEVEL=6 --pull waits
        import time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.profiler import profile, ProfilerActivity
        dist.init_process_group("gloo"); rank = dist.get_rank()
        model = DDP(torch.nn.Linear(64, 1))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(3):
                if rank == 0:
                    time.sleep(0.2)                 # the straggler
                model(torch.randn(8, 64)).sum().backward()
                torch.distributed.barrier()
        waits = sum(e.cpu_time_total for e in prof.key_averages() if e.key in ("gloo:all_reduce", "gloo:barrier")) / 1e3
        print(f"rank {rank}: {waits:.1f} ms waiting in all_reduce/barrier")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        print(dict(enumerate(waits)))
        if world_size > 1:   # the fast ranks wait for the straggler inside the collective; the straggler never waits
            assert min(waits[1:]) > waits[0]
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 12
@lesson("12_ddp_under_the_hood")
def _12():
    return [
        md("""
        # 12 · DDP under the hood (DDP 的内部机制)

        `DistributedDataParallel(model)` does four things, and this lesson does each by hand and measures it:
        1. **at construction** it broadcasts rank 0's parameters and buffers, so every replica starts equal;
        2. it registers an **autograd hook on every parameter**; during `backward()` each finished gradient is
           copied into a **bucket** (buckets of about `bucket_cap_mb`, 25 MB by default, filled in reverse
           parameter order, the order gradients become ready);
        3. as soon as a bucket is full it **launches an asynchronous all-reduce** of it, while backward goes on
           computing the earlier layers' gradients: communication **overlaps** computation;
        4. at the end of `backward()` it waits for the buckets and writes the **averaged** gradients to `.grad`.

        Then three things it needs to be told: parameters that get no gradient (`find_unused_parameters`),
        batch statistics across ranks (`SyncBatchNorm`) and ranks with fewer batches than others (`Join`).
        Everything runs on CPU with gloo.
        """),
        params("""
        world_size = 2
        hang_timeout = 5
        """),
        code(LOAD),
        md("""
        ## 1 · DDP by hand: broadcast once, all-reduce the gradients, divide by the world size
        The same model, the same data, three steps of SGD: once wrapped in DDP, once by hand. Both start from
        different random weights on each rank (`manual_seed(rank)`), so the broadcast matters.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull by_hand
        import torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

        def new_model():
            torch.manual_seed(rank)                       # different on every rank, on purpose
            return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

        g = torch.Generator().manual_seed(100 + rank)     # each rank its own data
        batches = [(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(3)]

        ddp = DDP(new_model())
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for x, y in batches:
            ddp_opt.zero_grad(); F.mse_loss(ddp(x), y).backward(); ddp_opt.step()

        mine = new_model()
        for p in mine.parameters():
            dist.broadcast(p.data, src=0)                 # (1) everyone starts from rank 0's weights
        opt = torch.optim.SGD(mine.parameters(), lr=0.1)
        for x, y in batches:
            opt.zero_grad(); F.mse_loss(mine(x), y).backward()
            for p in mine.parameters():                   # (2-4) without buckets: one all-reduce per tensor
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()

        by_hand = {"max |DDP - by hand|": max((a - b).abs().max().item() for a, b in zip(ddp.parameters(), mine.parameters())),
                   "weight sum": sum(p.sum().item() for p in mine.parameters())}
        print(by_hand)
        dist.destroy_process_group()
        """),
        code("""
        for rank, b in enumerate(by_hand):
            print(f"rank {rank}: {b}")
        """),
        md("""
        ## 2 · Buckets, and communication overlapping backward
        A comm hook sees each bucket as DDP hands it over (and here times it); a hook on the **first** layer's
        weight fires when the last gradient of backward is ready. With the default 25 MB this model (6 layers of
        256×256, 1.5 MB of gradients) is one bucket, all-reduced after backward has finished. With
        `bucket_cap_mb=0.25` it is one bucket per layer, and the first buckets are on their way while backward
        still computes the earlier layers.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull timeline@0
        import time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        world = dist.get_world_size()

        def average(state, bucket):                       # what DDP's default hook does
            fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0] / world)

        timeline = {}
        for cap in (25, 0.25):
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]), bucket_cap_mb=cap)
            events = []
            def timed(state, bucket):
                events.append(("bucket", bucket.index(), bucket.buffer().numel(), time.perf_counter()))
                return average(state, bucket)
            model.register_comm_hook(None, timed)
            model.module[0].weight.register_hook(lambda g: events.append(("last grad", -1, 0, time.perf_counter())))
            for step in range(3):                         # DDP settles its buckets after the first steps
                events.clear()
                x = torch.randn(64, 256)
                t0 = time.perf_counter()
                model(x).pow(2).mean().backward()
                t_end = time.perf_counter()
            timeline[cap] = {"events": [(kind, i, n, (t - t0) * 1e3) for kind, i, n, t in events],
                             "backward_ms": (t_end - t0) * 1e3}
        for cap, tl in timeline.items():
            order = [f"bucket {i} ({n * 4 / 2**20:.2f} MB)" if kind == "bucket" else "LAST GRAD" for kind, i, n, _ in tl["events"]]
            print(f"bucket_cap_mb={cap}: {' -> '.join(order)}")
        dist.destroy_process_group()
        """),
        code("""
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
        for ax, (cap, tl) in zip(axes, timeline.items()):
            ax.barh(0, tl["backward_ms"], color="C0", alpha=0.3, label="backward (call to return)")
            for kind, i, n, ms in tl["events"]:
                if kind == "bucket":
                    ax.plot(ms, 0, "v", color="C1", markersize=10)
                    ax.annotate(f"b{i}", (ms, 0.15), ha="center", fontsize=8)
                else:
                    ax.axvline(ms, color="C3", linestyle="--", label="last gradient ready")
            ax.set_yticks([]); ax.set_ylabel(f"cap {cap} MB", rotation=0, ha="right", va="center")
        axes[0].legend(loc="upper left", fontsize=8)
        axes[-1].set_xlabel("ms since backward() was called  (▼ = a bucket's all-reduce launched)")
        fig.suptitle("DDP launches each bucket's all-reduce as soon as its gradients are ready")
        fig.tight_layout(); plt.show()
        """),
        md("""
        ## 3 · A parameter without a gradient: `find_unused_parameters`
        DDP waits for **every** parameter's gradient before a bucket is complete. A layer that forward never
        used gets none, so the reduction never finishes, and the next iteration says so (torch's own error,
        caught on every rank). `find_unused_parameters=True` makes DDP walk the autograd graph after each
        forward and mark such parameters ready — at a cost on every step, so only where needed (or
        `static_graph=True` when the set never changes).
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull unused@0
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")

        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.head_a, self.head_b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
            def forward(self, x):
                return self.head_a(self.body(x))          # head_b is never used

        unused = {}
        model = DDP(TwoHeads())
        try:
            for step in range(2):
                model(torch.randn(4, 4)).sum().backward()
            unused["default"] = "no error"
        except RuntimeError as exc:
            unused["default"] = str(exc).split(". ")[0]
        model = DDP(TwoHeads(), find_unused_parameters=True)
        for step in range(2):
            model(torch.randn(4, 4)).sum().backward()
        unused["find_unused_parameters=True"] = f"{step + 1} steps, head_b.grad is {model.module.head_b.weight.grad}"
        print(unused)
        dist.destroy_process_group()
        """),
        md("""
        ## 4 · BatchNorm across ranks: `SyncBatchNorm`
        `BatchNorm` normalises with the mean and variance of **this rank's** batch: with 8 samples per rank, each
        rank uses different statistics than one big batch would. `SyncBatchNorm` all-reduces the sums first.
        torch runs it only on GPUs; on CPU it refuses (caught below, torch's own message). What it computes is
        three sums, so it is done by hand here and compared with a `BatchNorm` over the whole global batch.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 --pull bn
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        g = torch.Generator().manual_seed(7)
        everything = torch.randn(8 * world, 3, generator=g) * torch.tensor([1.0, 2.0, 3.0]) + torch.arange(8.0 * world).unsqueeze(1)
        x = everything[rank * 8:(rank + 1) * 8]           # this rank's 8 samples (their means differ by rank)

        bn = {}
        try:
            DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3))))
        except ValueError as exc:
            bn["torch on CPU"] = str(exc)

        local = torch.nn.functional.batch_norm(x, None, None, training=True)       # plain BatchNorm, this rank
        stats = torch.stack([x.sum(0), (x * x).sum(0), torch.full((3,), float(len(x)))])
        dist.all_reduce(stats)                                                      # what SyncBatchNorm reduces
        mean = stats[0] / stats[2]
        var = stats[1] / stats[2] - mean ** 2                                       # biased, as BatchNorm normalises
        synced = (x - mean) / torch.sqrt(var + 1e-5)
        reference = torch.nn.functional.batch_norm(everything, None, None, training=True)[rank * 8:(rank + 1) * 8]
        bn["|synced - whole batch|"] = (synced - reference).abs().max().item()
        bn["|local BN - whole batch|"] = (local - reference).abs().max().item()
        print(bn)
        dist.destroy_process_group()
        """),
        md("""
        ## 5 · Uneven inputs: the hang, and `Join`
        DDP's all-reduce in every `backward()` pairs up step *k* of every rank. If rank 1 has one batch more
        (an uneven split, lesson 05), its last backward waits for a partner that has left the loop: a hang.
        `--timeout` shows it; then the same loop inside `with Join([model]):` finishes: a rank that ran out of
        data keeps answering the others' all-reduces (with zeros) until all are done.
        """),
        code("""
        uneven = '''
        import contextlib, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.distributed.algorithms.join import Join
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        steps = 3 + rank                                   # rank r has 3 + r batches
        with JOIN:
            for step in range(steps):
                opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
        dist.barrier()                                     # e.g. before rank 0 saves a checkpoint
        weights = model.module.weight.sum().item()
        print(f"rank {rank}: {steps} steps, weight sum {weights:.6f}")
        '''
        import nbddp
        if world_size > 1:
            try:
                get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout {hang_timeout}",
                                             uneven.replace("JOIN", "contextlib.nullcontext()"))
                raise AssertionError("expected the uneven loop to hang")
            except nbddp.DDPTimeout as exc:
                without_join = exc.result
            for r in without_join.ranks:
                print(f"without Join, rank {r.rank}: {r.state}; blocked at {r.blocked_at}")
        get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60 --pull steps,weights", uneven.replace("JOIN", "Join([model])"))
        """),
        md("## Check"),
        code("""
        assert all(b["max |DDP - by hand|"] < 1e-6 for b in by_hand), by_hand      # by hand == DDP, on every rank
        assert len({round(b["weight sum"], 6) for b in by_hand}) == 1, by_hand      # and the replicas agree
        one, many = timeline[25]["events"], timeline[0.25]["events"]
        assert [kind for kind, *_ in one] == ["last grad", "bucket"], one           # default: one bucket, after backward
        buckets = [e for e in many if e[0] == "bucket"]
        last_grad = [ms for kind, _, _, ms in many if kind == "last grad"][0]
        assert len(buckets) == 6 and [i for _, i, _, _ in buckets] == list(range(6)), many
        assert sum(ms < last_grad for _, _, _, ms in buckets) >= 4, many           # launched while backward still ran
        assert unused["default"].startswith("Expected to have finished reduction in the prior iteration"), unused
        assert "head_b.grad is None" in unused["find_unused_parameters=True"], unused
        for b in bn:
            assert "SyncBatchNorm" in b["torch on CPU"] and "GPU" in b["torch on CPU"], b
            assert b["|synced - whole batch|"] < 1e-4 and b["|local BN - whole batch|"] > 0.1, b
        if world_size > 1:
            assert without_join.timed_out and any("backward" in (r.blocked_at or "") for r in without_join.ranks)
        assert steps == [3 + r for r in range(world_size)] and len({round(w, 6) for w in weights}) == 1, (steps, weights)
        print("ok: DDP by hand == DDP; buckets overlap backward; unused parameters, BatchNorm statistics and uneven "
              "inputs behave as described")
        """),
        md("""
        ## Exercise
        DDP's comm hooks can change how a bucket is sent. Write a hook that all-reduces each bucket in
        **bfloat16** (half the bytes) and divides by the world size, register it, and compare the gradients with
        DDP's default ones on the same model and data: how far apart are they?
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 --pull gap
        import copy, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

        def bf16_average(state, bucket):
            half = bucket.buffer().to(torch.bfloat16)
            fut = dist.all_reduce(half, async_op=True).get_future()
            def back(f):
                out = bucket.buffer()
                out.copy_(f.value()[0].to(out.dtype) / world)
                return out
            return fut.then(back)

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        plain, compressed = DDP(copy.deepcopy(net)), DDP(copy.deepcopy(net))
        compressed.register_comm_hook(None, bf16_average)
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
        for model in (plain, compressed):
            model(x).pow(2).mean().backward()
        gap = max(((a.grad - b.grad).abs().max() / a.grad.abs().max()).item()
                  for a, b in zip(plain.parameters(), compressed.parameters()))
        print(f"rank {rank}: largest relative difference {gap:.2e} (bfloat16 keeps ~3 significant digits)")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert all(0 < g < 1e-2 for g in gap), gap       # close, not equal: the bytes were rounded
        """, "solution"),
    ]


# --------------------------------------------------------------------------------------- 13
@lesson("13_fault_tolerance")
def _13():
    return [
        md("""
        # 13 · Fault tolerance: snapshots and `torchrun --max-restarts` (容错训练)

        A rank dies — a node reboots, a GPU falls off the bus, the OOM killer strikes. Plain DDP cannot lose a
        member: the other ranks are stopped (torchrun is fail-fast) and the job is over. torchrun can instead
        **restart the whole group** (`--max-restarts K`): every rank starts again from the first line of the
        script, with `TORCHELASTIC_RESTART_COUNT` counting the attempts. What the ranks knew is gone, so training
        resumes only if the script saves a **snapshot** (model, optimizer, epoch) and loads it when it starts.

        Below, rank 1 is **killed on purpose** (SIGKILL) halfway through an epoch on the first attempt. torchrun
        (`%%ddp --launcher torchrun --max-restarts 1`) stops rank 0 and starts both again; they load the snapshot
        and finish. The result is then compared with the same training without a failure.
        """),
        params("""
        world_size = 2
        epochs = 4
        kill_in_epoch = 2
        """),
        code(LOAD),
        md("""
        ## 1 · The training script: a snapshot after every epoch, loaded at start
        Under torchrun the ranks are torchrun's own processes, so `--pull` cannot reach them: rank 0 writes what
        the check needs to `history.jsonl`, as a real job writes its logs. Arguments: output folder, epochs, and
        the epoch in which rank 1 dies on the first attempt (`-1`: never).

        One line differs from lesson 04: `init_process_group` gets the launcher's store under a **prefix per
        attempt**. torchrun keeps one store for the whole job, and torch 2.13 does not separate the attempts in
        it: a restarted group that calls plain `init_process_group("gloo")` reads the dead attempt's addresses
        (`Gloo connectFullMesh failed … Connection refused` under plain torchrun here, a hang in
        `init_process_group` under `%%ddp --launcher torchrun`). First a clean folder:
        """),
        code("""
        import json, os, shutil, torch
        shutil.rmtree("runs/13", ignore_errors=True); os.makedirs("runs/13")
        """),
        md("""
        ## 2 · Under torchrun, with a rank killed and one restart allowed
        `--export runs/13/train.py` also saves the cell as a script, for the comparison run below.
        """),
        code("""
        %%ddp -n $world_size --launcher torchrun --max-restarts 1 --timeout 150 --export runs/13/train.py -- runs/13/failing $epochs $kill_in_epoch
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
                    f.write(json.dumps({"attempt": attempt, "epoch": epoch, "loss": mean}) + "\\n")
                print(f"attempt {attempt}, epoch {epoch}: loss {mean:.5f}, snapshot saved")
            dist.barrier()                                                # nobody races ahead of the snapshot
        dist.destroy_process_group()
        """),
        code("""
        failing = _ddp
        train = open("runs/13/train.py").read()
        history = [json.loads(line) for line in open("runs/13/failing/history.jsonl")]
        for h in history:
            print(h)
        """),
        md("## 3 · The same script without a failure (plain `%%ddp`, no kill)"),
        code("""
        get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60 --output text -- runs/13/clean {epochs} -1", train)
        clean = [json.loads(line) for line in open("runs/13/clean/history.jsonl")]
        """),
        md("## Check"),
        code("""
        assert failing.ok and any("restarted by torchrun" in note for note in failing.notes), failing.notes
        assert [(h["attempt"], h["epoch"]) for h in history] == (
            [(0, e) for e in range(kill_in_epoch)] + [(1, e) for e in range(kill_in_epoch, epochs)]), history
        assert [(h["attempt"], h["epoch"]) for h in clean] == [(0, e) for e in range(epochs)], clean
        assert max(abs(a["loss"] - b["loss"]) for a, b in zip(history, clean)) < 1e-6, (history, clean)
        resumed, uninterrupted = torch.load("runs/13/failing/snapshot.pt"), torch.load("runs/13/clean/snapshot.pt")
        assert all(torch.allclose(resumed["model"][k], uninterrupted["model"][k], atol=1e-6) for k in resumed["model"])
        print(f"ok: killed in epoch {kill_in_epoch}, restarted by torchrun, resumed from the snapshot; the final model "
              "equals the one trained without a failure (only the half epoch was done twice)")
        """),
        md("""
        ## Exercise
        Without `--max-restarts` torchrun does not restart anything. Run the failing job so (into
        `runs/13/no_restart`): how does the cell end, which state does `_ddp` give rank 1, and from which epoch
        could a manual rerun resume?
        """),
        md("### Solution"),
        code("""
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
        """, "solution"),
        md("""
        The job ends at once, and the rank that **survived** reports an error (`Connection closed` or `reset by
        peer`): a
        symptom, not the cause. The cause is in the log of the rank whose process died (`SIGKILL`, and its last
        line, "killed on purpose"). The snapshot of epoch 1 is still there: rerunning the cell would resume at
        epoch 2, the same as torchrun's restart did.
        """, ),
        code("""
        assert "by peer" in no_restart.ranks[0].describe(), no_restart.ranks[0].describe()   # closed / reset by peer
        assert no_restart.ranks[1].exitcode == -9 and "killed on purpose" in no_restart.ranks[1].stdout   # -9: SIGKILL
        assert left == kill_in_epoch, left
        """, "solution"),
    ]


def build() -> dict[str, nbformat.NotebookNode]:
    books = {}
    for name, cells in LESSONS:
        nb = nbformat.v4.new_notebook()
        nb.cells = cells
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        books[f"{name}.ipynb"] = nb
    return books


def _ids(nb):
    for i, cell in enumerate(nb.cells):      # stable ids: rebuilds give identical files
        cell["id"] = f"c{i:02d}"
    return nb


def main(argv) -> int:
    check = "--check" in argv
    stale = []
    for fname, nb in build().items():
        path = os.path.join(HERE, fname)
        text = nbformat.writes(_ids(nb)) + "\n"
        if check:
            if not os.path.exists(path) or open(path).read() != text:
                stale.append(fname)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote", path)
    if stale:
        print("out of date (run python notebooks/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
