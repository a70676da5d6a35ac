"""Build the lesson notebooks 01-10 (unexecuted) from the cell texts below.

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
        | `LOCAL_RANK` | 本地秩 | its number **on its machine**, `0 … nproc_per_node-1`; picks the GPU: `cuda:LOCAL_RANK` |
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
        %%ddp -n $world_size --timeout 60
        import os, torch.distributed as dist
        dist.init_process_group("gloo")
        print(f"RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']} "
              f"MASTER={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} | get_rank()={dist.get_rank()} "
              f"get_world_size()={dist.get_world_size()}")
        dist.destroy_process_group()
        """),
        code("""
        for r in _ddp.ranks:
            assert f"RANK={r.rank} " in r.stdout and f"get_rank()={r.rank} " in r.stdout, r.stdout
            assert f"WORLD_SIZE={world_size} " in r.stdout
        ports = {line.split("MASTER=")[1].split()[0] for r in _ddp.ranks for line in r.stdout.splitlines() if "MASTER=" in line}
        assert len(ports) == 1, ports          # every rank meets at the same address:port
        print("all ranks agree on the meeting point", ports.pop())
        """),
        md("""
        ## 2 · Simulated nodes: the layout
        `--nnodes 2 --nproc-per-node 2` gives 4 ranks as if on 2 machines with 2 processes each. Each rank prints
        its node (`GROUP_RANK`), local rank and global rank as one JSON line.
        """),
        code("""
        %%ddp --nnodes $nnodes --nproc-per-node $nproc_per_node --timeout 60
        import os, json
        me = {k: int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")}
        print("LAYOUT " + json.dumps(me))
        """),
        code("""
        import json
        layout = [json.loads(line[7:]) for r in _ddp.ranks for line in r.stdout.splitlines() if line.startswith("LAYOUT ")]
        for me in sorted(layout, key=lambda m: m["RANK"]):
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
        %%ddp -n $world_size --ranks 0 --timeout 60
        import os, json
        KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
        for k in sorted(mine):
            print(f"{k:32} {mine[k]}")
        print("ENV " + json.dumps(mine))
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
        code("""
        import json
        envs = {}
        for r in _ddp.ranks:
            for line in r.stdout.splitlines():
                if line.startswith("ENV "):
                    envs[r.rank] = json.loads(line[4:])
        local_keys = set().union(*(e.keys() for e in envs.values()))
        print(sorted(local_keys))
        """),
        md("""
        ## 2 · The same cell under real torchrun
        `--launcher torchrun` hands the cell to torch's own launcher (`torch.distributed.run`). Slower (it starts
        fresh Python processes), but it is the real thing: compare the keys.
        """),
        code("""
        %%ddp -n $world_size --launcher torchrun --ranks 0 --timeout 60
        import os, json
        KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        mine = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith("TORCHELASTIC_")}
        print("ENV " + json.dumps(mine))
        """),
        code("""
        torchrun_env = json.loads([l for l in _ddp.ranks[0].stdout.splitlines() if l.startswith("ENV ")][0][4:])
        print("only under torchrun:", sorted(set(torchrun_env) - local_keys))
        print("only under %%ddp:   ", sorted(local_keys - set(torchrun_env)))
        """),
        md("""
        ## 3 · The legacy launcher: `--local_rank` in argv
        `python -m torch.distributed.launch --nproc_per_node=2 train.py` (deprecated) did not only set variables:
        it **added `--local_rank=N` to your script's arguments** (unless you passed `--use_env`). Scripts of that
        era therefore have `parser.add_argument("--local_rank", type=int)`. `%%ddp --legacy-launch underscore`
        reproduces it (`--legacy-launch` alone gives the newer spelling `--local-rank=N`).
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
        The same script under `torchrun` gets no such argument — `args.local_rank` stays `-1`, and a script that
        does `torch.cuda.set_device(args.local_rank)` breaks. That is the usual migration bug:
        """),
        code("""
        %%ddp -n $world_size --timeout 60 -- --lr 0.1
        import argparse, os, sys
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=-1)
        parser.add_argument("--lr", type=float)
        args = parser.parse_args()
        print(f"argv={sys.argv[1:]} -> args.local_rank={args.local_rank}, LOCAL_RANK={os.environ['LOCAL_RANK']}")
        """),
        code("""
        migrated = _ddp
        for r in migrated.ranks:
            assert f"args.local_rank=-1, LOCAL_RANK={r.local_rank}" in r.stdout, r.stdout
        print("under torchrun-style launch the argument is missing; LOCAL_RANK is in the environment")
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
        | `reduce(t, dst, op)` | `dst` gets the sum (or max, …) of all ranks' tensors |
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
        %%ddp -n $world_size --timeout 60
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
        assert f"rank 0: token = {world_size if world_size > 1 else 0}" in _ddp.ranks[0].stdout
        """),
        md("## 2 · All the collectives, each rank starting from `rank + 1`"),
        code("""
        %%ddp -n $world_size --timeout 60
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        show = lambda name, value: print(f"{name:11} rank {rank}: {value}")

        t = torch.tensor([rank + 1.0]); dist.broadcast(t, src=0);              show("broadcast", t.tolist())
        t = torch.tensor([rank + 1.0]); dist.reduce(t, dst=0, op=dist.ReduceOp.SUM); show("reduce", t.tolist())
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
        total = world_size * (world_size + 1) / 2
        out0 = _ddp.ranks[0].stdout
        assert f"all_reduce  rank 0: [{total}]" in out0 and f"reduce      rank 0: [{total}]" in out0, out0
        assert f"all_gather  rank {world_size - 1}: {[float(i + 1) for i in range(world_size)]}" in _ddp.ranks[-1].stdout
        assert f"scatter     rank {world_size - 1}: [{10.0 * (world_size - 1)}]" in _ddp.ranks[-1].stdout
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
        %%ddp -n $world_size --timeout 60
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
        print(f"RING_ERR {err}")
        dist.destroy_process_group()
        """),
        md("## Check"),
        code("""
        errs = [float(l.split()[1]) for r in _ddp.ranks for l in r.stdout.splitlines() if l.startswith("RING_ERR")]
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
        %%ddp -n $world_size --timeout 60
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
        assert all("ring all_gather equal: True" in r.stdout for r in _ddp.ranks)
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
        2. `dist.init_process_group(backend, init_method="env://")` — rank, world size and meeting point come from
           the variables the launcher set;
        3. `torch.cuda.set_device(local_rank)` — **only with GPUs** (one GPU per process);
        4. wrap the model: `DDP(model, device_ids=[local_rank])` (no `device_ids` on CPU); gradients are
           averaged over ranks during `backward()`;
        5. `DistributedSampler` gives each rank its own part of the data; `sampler.set_epoch(epoch)` reshuffles;
        6. save the checkpoint **on rank 0 only**, then `dist.barrier()` so nobody reads it before it exists;
        7. `dist.destroy_process_group()` at the end.
        """),
        params("""
        world_size = 2
        epochs = 2
        out_dir = "runs/04"
        """),
        code(LOAD),
        md("## 1 · The single-device version (runs in the notebook itself)"),
        code("""
        import torch
        from torch.utils.data import TensorDataset, DataLoader

        def make_data():
            g = torch.Generator().manual_seed(0)
            X = torch.randn(512, 8, generator=g)
            y = X @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(512, 1, generator=g)
            return TensorDataset(X, y)

        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = DataLoader(make_data(), batch_size=32, shuffle=True)
        single_losses = []
        for epoch in range(epochs):
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
        a complete script: `%ddp_export` can write it to a file for torchrun (cell below).
        """),
        code("""
        %%ddp -n $world_size --timeout 60 -- --epochs $epochs --out $out_dir
        import argparse, os
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import TensorDataset, DataLoader, DistributedSampler

        def make_data():
            g = torch.Generator().manual_seed(0)
            X = torch.randn(512, 8, generator=g)
            y = X @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(512, 1, generator=g)
            return TensorDataset(X, y)

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--epochs", type=int, default=1)
            parser.add_argument("--lr", type=float, default=0.05)
            parser.add_argument("--out", default="runs")
            parser.add_argument("--local-rank", "--local_rank", type=int,               # (1)
                                default=int(os.environ.get("LOCAL_RANK", 0)))
            args = parser.parse_args()

            use_cuda = torch.cuda.is_available()
            dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")   # (2)
            rank, world = dist.get_rank(), dist.get_world_size()
            if use_cuda:                                                                 # (3) GPU only
                torch.cuda.set_device(args.local_rank)
            device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")

            torch.manual_seed(0)                             # same initial weights on every rank
            model = torch.nn.Linear(8, 1).to(device)
            model = DDP(model, device_ids=[args.local_rank] if use_cuda else None)    # (4)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr)

            data = make_data()
            sampler = DistributedSampler(data, shuffle=True, seed=0)                   # (5)
            loader = DataLoader(data, batch_size=32 // world, sampler=sampler)         # same global batch
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
                if rank == 0:
                    print(f"epoch {epoch}: loss {(stats[0] / stats[1]).item():.4f} ({int(stats[1])} samples)")

            if rank == 0:                                                              # (6)
                os.makedirs(args.out, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "epochs": args.epochs}, f"{args.out}/ckpt.pt")
            dist.barrier()                                   # rank 0 has written it before anyone goes on
            ckpt = torch.load(f"{args.out}/ckpt.pt", map_location=device)
            print(f"rank {rank}: loaded checkpoint of epoch {ckpt['epochs']}, weight sum "
                  f"{model.module.weight.sum().item():.6f}")
            dist.destroy_process_group()                                               # (7)

        if __name__ == "__main__":
            main()
        """),
        code("""
        %ddp_export $out_dir/train_ddp.py
        """),
        md("## Check"),
        code("""
        import os, re
        assert _ddp.ok
        losses = [float(x) for x in re.findall(r"epoch \\d+: loss ([\\d.]+)", _ddp.ranks[0].stdout)]
        assert len(losses) == epochs and losses[-1] < losses[0], losses
        assert f"(512 samples)" in _ddp.ranks[0].stdout            # the ranks together saw the whole data set once
        sums = {re.search(r"weight sum (\\S+)", r.stdout).group(1) for r in _ddp.ranks}
        assert len(sums) == 1, sums                                 # DDP kept the replicas identical
        assert os.path.exists(f"{out_dir}/ckpt.pt") and os.path.exists(f"{out_dir}/train_ddp.py")
        print("ok: DDP losses", losses, "vs single device", [round(l, 4) for l in single_losses])
        """),
        md("""
        ## Exercise
        Resume training: start a second job that loads `ckpt.pt` on every rank **before** wrapping with DDP, trains
        one more epoch, and prints the loss. (DDP broadcasts rank 0's weights at construction, but loading on all
        ranks keeps optimizer state and bookkeeping consistent too.)
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 -- --out $out_dir
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
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sampler = DistributedSampler(data, seed=0); sampler.set_epoch(ckpt["epochs"])
        stats = torch.zeros(2)
        for xb, yb in DataLoader(data, batch_size=32 // dist.get_world_size(), sampler=sampler):
            opt.zero_grad(); loss = torch.nn.functional.mse_loss(model(xb), yb); loss.backward(); opt.step()
            stats += torch.tensor([loss.item() * len(xb), len(xb)])
        dist.all_reduce(stats)
        if dist.get_rank() == 0:
            print(f"resumed epoch {ckpt['epochs']}: loss {(stats[0] / stats[1]).item():.4f}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        resumed = float(re.search(r"loss ([\\d.]+)", _ddp.ranks[0].stdout).group(1))
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
        %%ddp -n $world_size --timeout 60 -- $N
        import json, os, sys
        from torch.utils.data import DistributedSampler
        N = int(sys.argv[1])
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        for drop_last in (False, True):       # num_replicas/rank given: no process group needed
            s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
            print("SHARD " + json.dumps({"drop_last": drop_last, "rank": rank, "indices": list(s)}))
        s = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True, seed=0)
        for epoch in (0, 1):
            s.set_epoch(epoch)
            print("SHUFFLED " + json.dumps({"epoch": epoch, "rank": rank, "indices": list(s)}))
        """),
        code("""
        import json, math
        rows = [json.loads(l.split(" ", 1)[1]) for r in _ddp.ranks for l in r.stdout.splitlines() if l.startswith("SHARD ")]
        shuffled = [json.loads(l.split(" ", 1)[1]) for r in _ddp.ranks for l in r.stdout.splitlines() if l.startswith("SHUFFLED ")]
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
        %%ddp -n $world_size --timeout 60 -- $N
        import sys, torch, torch.distributed as dist
        from torch.utils.data import DistributedSampler
        dist.init_process_group("gloo")
        N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
        correct = lambda idx: torch.tensor([float(i % 4 != 0) for i in idx])

        padded = list(DistributedSampler(range(N), shuffle=False))         # the training sampler, reused
        exact = list(range(rank, N, world))                                # unpadded, uneven split
        c = correct(padded)
        if rank == 0: print(f"RANK0_ONLY {c.mean().item():.6f}")
        stats = torch.tensor([c.sum().item(), len(padded)]); dist.all_reduce(stats)
        if rank == 0: print(f"ALLREDUCE_PADDED {(stats[0] / stats[1]).item():.6f}")
        stats = torch.tensor([correct(exact).sum().item(), len(exact)]); dist.all_reduce(stats)
        if rank == 0: print(f"ALLREDUCE_EXACT {(stats[0] / stats[1]).item():.6f} over {int(stats[1])} samples")
        dist.destroy_process_group()
        """),
        md("## Check"),
        code("""
        import re
        out = _ddp.ranks[0].stdout
        got = {k: float(v) for k, v in re.findall(r"(RANK0_ONLY|ALLREDUCE_PADDED|ALLREDUCE_EXACT) ([\\d.]+)", out)}
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
        %%ddp -n $world_size --timeout 60 -- $N
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        N = int(sys.argv[1]); rank, world = dist.get_rank(), dist.get_world_size()
        losses = torch.tensor([(i * 0.1) ** 2 for i in range(rank, N, world)])
        naive = losses.mean().clone(); dist.all_reduce(naive); naive /= world        # mean of means: wrong weights
        s = torch.tensor([losses.sum().item(), float(len(losses))]); dist.all_reduce(s)  # sum and count: right
        if rank == 0:
            print(f"NAIVE {naive.item():.6f} WEIGHTED {(s[0] / s[1]).item():.6f}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        naive, weighted = map(float, re.search(r"NAIVE (\\S+) WEIGHTED (\\S+)", _ddp.ranks[0].stdout).groups())
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

        Four mistakes everybody makes once. Each is reproduced on purpose here, caught, and checked, so you
        recognise the message when it happens for real.
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
        Another job (or a crashed one) still holds the port. torchrun fails with `EADDRINUSE`; `%%ddp` checks
        before starting anything.
        """),
        code("""
        import socket
        from IPython.core.error import UsageError
        holder = socket.socket(); holder.bind(("127.0.0.1", 0)); holder.listen()
        busy_port = holder.getsockname()[1]
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
        ## 5 · Not a pitfall here: a tutorial's own `setup()`
        PyTorch's DDP tutorial starts each process with its own meeting point and numbers:
        `os.environ["MASTER_PORT"] = "12355"` then `init_process_group("gloo", rank=rank, world_size=world_size)`
        (or `init_method="tcp://127.0.0.1:12355"`). Under `torchrun --standalone` that code **hangs**: torchrun tells
        its ranks `TORCHELASTIC_USE_AGENT_STORE=True` ("the launcher hosts the store"), so rank 0 too waits as a
        client on a port no one serves. `%%ddp` sets the same variable, but uses its own store only when the cell
        aims at it; aimed elsewhere, rank 0 hosts the store as in a plain script, and the cell runs. The same holds
        in processes a rank starts with `mp.spawn` (the tutorial's whole script in a `%%ddp -n 1` cell runs).
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
        get_ipython().run_cell_magic("ddp", f"-n {world_size} --timeout 60", tutorial)
        own_rendezvous = _ddp
        """),
        md("""
        What cannot work on one machine fails at once, naming the line: an address that is not this machine's,
        a port another process holds, or a `world_size` other than the launch's (the group would wait forever):
        """),
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
        from nbddp.spec import make_spec
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

        **Mixed precision** (混合精度): on CPU, `torch.autocast("cpu", dtype=torch.bfloat16)` runs matmuls in
        bfloat16 while the weights stay float32. On CUDA the classic recipe is fp16 + `GradScaler` (scales the loss
        so small fp16 gradients do not underflow); those cells run only where a GPU exists.
        """),
        params("""
        world_size = 2
        accum = 4
        """),
        code(LOAD),
        md("""
        ## 1 · `no_sync` gives the big-batch gradient, with one all-reduce instead of `accum`
        A DDP comm hook counts how often DDP all-reduces; a plain copy of the model computes the big-batch gradient.
        """),
        code("""
        %%ddp -n $world_size --timeout 60 -- $accum
        import contextlib, copy, sys
        import torch, torch.distributed as dist, torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        dist.init_process_group("gloo")
        rank, world, accum, micro = dist.get_rank(), dist.get_world_size(), int(sys.argv[1]), 8

        g = torch.Generator().manual_seed(1)
        X = torch.randn(world * accum * micro, 6, generator=g); Y = torch.randn(world * accum * micro, 1, generator=g)
        mine = slice(rank * accum * micro, (rank + 1) * accum * micro)     # this rank's part of the global batch

        def run(use_no_sync):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            reference = copy.deepcopy(net)
            model = DDP(net)
            calls = [0]
            def counting(state, bucket):
                calls[0] += 1
                return allreduce_hook(state, bucket)
            model.register_comm_hook(None, counting)
            Xr, Yr = X[mine], Y[mine]
            for i in range(accum):
                last = i == accum - 1
                ctx = model.no_sync() if (use_no_sync and not last) else contextlib.nullcontext()
                with ctx:
                    loss = F.mse_loss(model(Xr[i * micro:(i + 1) * micro]), Yr[i * micro:(i + 1) * micro]) / accum
                    loss.backward()
            F.mse_loss(reference(X), Y).backward()        # one step on the whole global batch, no DDP
            err = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.module.parameters(), reference.parameters()))
            return calls[0], err

        for use in (True, False):
            calls, err = run(use)
            print(f"RESULT no_sync={use} all_reduce_calls={calls} max_grad_diff={err:.3e}")
        dist.destroy_process_group()
        """),
        code("""
        import re
        results = {(r.rank, m[0]): (int(m[1]), float(m[2])) for r in _ddp.ranks
                   for m in re.findall(r"no_sync=(\\w+) all_reduce_calls=(\\d+) max_grad_diff=(\\S+)", r.stdout)}
        for key, (calls, err) in sorted(results.items()):
            print(f"rank {key[0]} no_sync={key[1]:5}: {calls} all-reduce call(s), max |grad - big batch grad| = {err:.1e}")
        """),
        md("""
        ## 2 · bfloat16 autocast on CPU
        The forward runs in bfloat16 under `autocast`; the loss is computed in float32 and gradients land on the
        float32 weights.
        """),
        code("""
        %%ddp -n $world_size --timeout 60
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
        print(f"AMP out={out.dtype} weights={next(model.parameters()).dtype} grads={next(model.parameters()).grad.dtype} "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        dist.destroy_process_group()
        """),
        code("""
        bf16 = _ddp
        for r in bf16.ranks:
            print(r.stdout.strip())
        """),
        md("## 3 · CUDA: fp16 + GradScaler (runs only with one GPU per rank)"),
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
        for r in bf16.ranks:
            first, last = map(float, re.search(r"loss (\\S+) -> (\\S+)", r.stdout).groups())
            assert "out=torch.bfloat16 weights=torch.float32 grads=torch.float32" in r.stdout, r.stdout
            assert last < first / 2, (first, last)                              # bf16 autocast still trains
        for rank in range(world_size):
            calls_sync, err_sync = results[(rank, "True")]
            calls_all, err_all = results[(rank, "False")]
            assert err_sync < 1e-5 and err_all < 1e-5, (err_sync, err_all)     # both equal the big-batch gradient
            assert calls_all == accum * calls_sync, (calls_all, calls_sync)     # no_sync saved accum-1 all-reduces
        print("ok: no_sync accumulation == big batch, with", results[(0, "True")][0], "instead of",
              results[(0, "False")][0], "all-reduce calls")
        """),
        md("""
        ## Exercise
        Accumulate over `accum` micro-batches with `no_sync()` **and** bfloat16 autocast, then check on every rank
        that the weights after the step are identical across ranks (`all_gather` a checksum).
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60 -- $accum
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
        print(f"replicas identical: {all(torch.equal(e, every[0]) for e in every)}")
        dist.destroy_process_group()
        """, "solution"),
        code("""
        assert all("replicas identical: True" in r.stdout for r in _ddp.ranks)
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
        %%ddp -n $world_size --timeout 60
        import nbddp, torch.distributed as dist
        dist.init_process_group(nbddp.backend())
        print(f"rank {dist.get_rank()}: nbddp.backend() = {nbddp.backend()}, in use: {dist.get_backend()}")
        dist.destroy_process_group()
        """),
        code("""
        chosen = "nccl" if torch.cuda.is_available() else "gloo"
        assert all(f"in use: {chosen}" in r.stdout for r in _ddp.ranks)
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
        %%ddp -n $world_size --timeout 60 -- $reps $max_log2
        import json, sys, time, torch, torch.distributed as dist
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
        if dist.get_rank() == 0:
            print("TIMES " + json.dumps(rows))
        dist.destroy_process_group()
        """),
        code("""
        import json
        import matplotlib.pyplot as plt
        rows = json.loads([l for l in _ddp.ranks[0].stdout.splitlines() if l.startswith("TIMES ")][0][6:])
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
        %%ddp -n $world_size --timeout 60 -- $reps
        import statistics, sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        reps = int(sys.argv[1]); t = torch.ones(2 ** 18)      # 1 MiB
        def timed(fn):
            fn(); out = []
            for _ in range(reps):
                dist.barrier(); t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
            return statistics.median(out)
        b, r = timed(lambda: dist.broadcast(t, 0)), timed(lambda: dist.all_reduce(t))
        if dist.get_rank() == 0:
            print(f"BCAST {b * 1e3:.3f} ms  ALLREDUCE {r * 1e3:.3f} ms")
            # broadcast only moves data one way; all_reduce also adds and sends results back (about 2x the traffic)
        dist.destroy_process_group()
        """, "solution"),
        code("""
        import re
        bcast, allred = map(float, re.search(r"BCAST (\\S+) ms  ALLREDUCE (\\S+) ms", _ddp.ranks[0].stdout).groups())
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
        1. **log to one file per rank** (and print to the screen on rank 0 only);
        2. **profile per rank** and look at communication (`all_reduce`) next to compute;
        3. when it breaks, match the symptom to the **cheat sheet** below and do its drill.
        """),
        params("""
        world_size = 2
        log_dir = "runs/10/logs"
        """),
        code(LOAD),
        md("""
        ## 1 · Per-rank log files, screen output on rank 0 only
        `logging` writes every rank to `rank{N}.log`; `print` is guarded by `if rank == 0`. (nbddp also keeps
        each rank's full stdout/stderr in `--log-dir`; `--ranks 0` shows only rank 0 in the notebook while all
        ranks run.)
        """),
        code("""
        %%ddp -n $world_size --log-dir $log_dir/nbddp --timeout 60 -- $log_dir
        import logging, os, sys, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        os.makedirs(sys.argv[1], exist_ok=True)
        logging.basicConfig(filename=f"{sys.argv[1]}/rank{rank}.log", filemode="w", level=logging.INFO,
                            format=f"%(asctime)s rank{rank} %(levelname)s %(message)s")
        log = logging.getLogger("train")
        model = DDP(torch.nn.Linear(32, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(5):
            opt.zero_grad(); loss = model(torch.randn(16, 32)).pow(2).mean(); loss.backward(); opt.step()
            log.info("step %d loss %.4f", step, loss.item())       # every rank, into its own file
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}")       # the screen: rank 0 only
        dist.destroy_process_group()
        """),
        code("""
        import glob, os
        logs = sorted(glob.glob(f"{log_dir}/rank*.log"))
        print(logs)
        print(open(logs[-1]).read().splitlines()[-1])
        assert len(logs) == world_size and all(len(open(p).read().splitlines()) == 5 for p in logs)
        assert all(not r.stdout for r in _ddp.ranks[1:]) and "step 4" in _ddp.ranks[0].stdout
        assert os.path.exists(_ddp.ranks[1].stdout_path) and _ddp.log_dir.startswith(os.path.abspath(log_dir))
        """),
        md("""
        ## 2 · The profiler, per rank: find the all-reduce
        `torch.profiler` inside each rank; DDP's gradient all-reduce shows up as `gloo:all_reduce` (NCCL:
        `nccl:all_reduce`) next to the compute ops. Each rank also writes a Chrome trace (open it in
        `chrome://tracing` or Perfetto).
        """),
        code("""
        %%ddp -n $world_size --timeout 60 -- $log_dir
        import json, sys, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.profiler import profile, ProfilerActivity
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for step in range(5):
                opt.zero_grad(); model(torch.randn(64, 256)).pow(2).mean().backward(); opt.step()
        events = prof.key_averages()
        comm = [e for e in events if "all_reduce" in e.key]
        if rank == 0:
            print(events.table(sort_by="cpu_time_total", row_limit=8))
        print("COMM " + json.dumps({"rank": rank, "events": {e.key: e.count for e in comm},
                                     "us": sum(e.cpu_time_total for e in comm)}))
        prof.export_chrome_trace(f"{sys.argv[1]}/trace_rank{rank}.json")
        dist.destroy_process_group()
        """),
        code("""
        import json
        comm = [json.loads(l[5:]) for r in _ddp.ranks for l in r.stdout.splitlines() if l.startswith("COMM ")]
        for c in comm:
            print(f"rank {c['rank']}: {c['events']}  ({c['us'] / 1e3:.2f} ms in all_reduce)")
        """),
        md("""
        ## 3 · Error cheat sheet (错误速查表)

        | symptom | likely cause | what to do | drill |
        |---|---|---|---|
        | **OOM** (`CUDA out of memory`, `can't allocate memory`) | batch too big *per rank*; every rank holds a full model copy; rank 0 also gathers everything | lower the per-rank batch, accumulate (lesson 08), `bf16`, don't gather big tensors on rank 0 | A |
        | **no speedup** with more ranks | model too small: all-reduce dominates; ranks share cores (CPU) or one GPU; data loading the bottleneck | bigger per-rank work, check `OMP_NUM_THREADS`, profile (section 2) | B |
        | **wrong metrics** (accuracy differs with world size) | metric from rank 0's shard only; padded sampler counts repeats; mean of means | `all_reduce` sums and counts (lesson 05) | C |
        | **hang** (no output, 100 % or 0 % CPU) | a collective not called by all ranks, or in a different order; unequal number of batches | `--timeout` shows each rank's stack; `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch | D |
        | `MASTER_ADDR expected, but not set` | run with `python`, not a launcher | `torchrun` / `%%ddp` (lesson 06) | — |
        | `Address already in use` | a port still held by another job | another `--master-port`, or let it choose (lesson 06) | — |
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
        ### Drill B · no speedup: time the step, and the all-reduce inside it
        The same global batch on 1 rank and on `world_size` ranks. On a tiny model the all-reduce and process
        overhead eat the gain — measure before you buy more GPUs.
        """),
        code("""
        speed = '''
        import time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        world = dist.get_world_size()
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
        x = torch.randn(256 // world, 64)
        for _ in range(3): model(x).sum().backward()
        t0 = time.perf_counter()
        for _ in range(20): model(x).sum().backward()
        step = (time.perf_counter() - t0) / 20
        g = torch.randn(64 * 64 + 64 + 65); t0 = time.perf_counter()
        for _ in range(20): dist.all_reduce(g)
        comm = (time.perf_counter() - t0) / 20
        if dist.get_rank() == 0: print(f"STEP {step * 1e3:.3f} ALLREDUCE {comm * 1e3:.3f}")
        '''
        import re
        timing = {}
        for n in sorted({1, world_size}):
            get_ipython().run_cell_magic("ddp", f"-n {n} --output text --ranks 0 --timeout 60", speed)
            timing[n] = tuple(map(float, re.search(r"STEP (\\S+) ALLREDUCE (\\S+)", _ddp.ranks[0].stdout).groups()))
        for n, (step, reduce_ms) in timing.items():
            print(f"{n} rank(s): {step:.3f} ms per step (same global batch), all_reduce of the grads {reduce_ms:.3f} ms")
        assert all(step > 0 and reduce_ms > 0 for step, reduce_ms in timing.values())
        """),
        md("### Drill C · wrong metrics: the metric depends on the world size"),
        code("""
        metric = '''
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        scores = torch.arange(10.0)[rank::world]                # this rank's shard of 10 samples
        wrong = scores.mean().item()                            # rank 0's shard only
        s = torch.tensor([scores.sum().item(), float(len(scores))]); dist.all_reduce(s)
        if rank == 0: print(f"WRONG {wrong:.3f} RIGHT {(s[0] / s[1]).item():.3f}")
        '''
        get_ipython().run_cell_magic("ddp", f"-n {world_size} --output text --timeout 60", metric)
        wrong, right = map(float, re.search(r"WRONG (\\S+) RIGHT (\\S+)", _ddp.ranks[0].stdout).groups())
        print("rank 0 only:", wrong, "| all_reduce:", right, "| true mean:", 4.5)
        assert right == 4.5 and (world_size == 1 or wrong != 4.5)
        """),
        md("### Drill D · a hang made loud: `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatch"),
        code("""
        import nbddp
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
        assert all(os.path.getsize(f"{log_dir}/trace_rank{r}.json") > 0 for r in range(world_size))
        print("ok: per-rank logs, per-rank profiles with the all-reduce, and the drills behaved as the cheat sheet says")
        """),
        md("""
        ## Exercise
        One rank is slow (it `sleep`s 0.2 s before each step). Profile all ranks: which rank shows **more** time
        in `all_reduce`, the slow one or the others? Why?
        """),
        md("### Solution"),
        code("""
        %%ddp -n $world_size --timeout 60
        import json, time, torch, torch.distributed as dist
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
        waits = sum(e.cpu_time_total for e in prof.key_averages() if e.key in ("gloo:all_reduce", "gloo:barrier"))
        print("WAIT " + json.dumps({"rank": rank, "ms": waits / 1e3}))
        dist.destroy_process_group()
        """, "solution"),
        code("""
        waits = {d["rank"]: d["ms"] for d in (json.loads(l[5:]) for r in _ddp.ranks for l in r.stdout.splitlines() if l.startswith("WAIT "))}
        print(waits)
        if world_size > 1:   # the fast ranks wait for the straggler inside the collective; the straggler never waits
            assert min(waits[r] for r in range(1, world_size)) > waits[0]
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
