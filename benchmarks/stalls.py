"""Count slow init_process_group calls: many launches of 4 ranks forked from a forkserver (torch
preloaded), meeting at a TCPStore hosted by this process, as nbddp's launches do, without nbddp.

    .venv/bin/python benchmarks/stalls.py 200                 # the store on torch's own listener
    .venv/bin/python benchmarks/stalls.py 200 --nbddp-store   # on nbddp's (nbddp/forkserver/tcpstore.py)
    strace -f -e trace=connect -o st.txt .venv/bin/python benchmarks/stalls.py 5; grep -c 'htons(53)' st.txt

Prints every launch whose slowest rank took over 2 s in init_process_group, then the median,
p95 and max of the slowest rank's init time per launch.
"""
import argparse
import multiprocessing as mp
import os
import statistics
import time
from datetime import timedelta


def rank_main(rank, world, addr, port, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT=str(port),
                      TORCHELASTIC_USE_AGENT_STORE="True")
    import torch
    import torch.distributed as dist
    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    t1 = time.perf_counter()
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()
    q.put((rank, t1 - t0))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("launches", type=int)
    p.add_argument("--addr", default="localhost")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--nbddp-store", action="store_true", help="host the store as nbddp does")
    a = p.parse_args()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    from torch.distributed import TCPStore
    q = ctx.Queue()
    slowest = []
    for i in range(a.launches):
        if a.nbddp_store:
            from nbddp.forkserver.tcpstore import host_store
            store, port = host_store(a.addr, None)
        else:
            store = TCPStore(a.addr, 0, None, True, timedelta(seconds=60), wait_for_workers=False)
            port = store.port
        procs = [ctx.Process(target=rank_main, args=(r, a.ranks, a.addr, port, q)) for r in range(a.ranks)]
        for proc in procs:
            proc.start()
        inits = sorted(q.get(timeout=120) for _ in procs)
        for proc in procs:
            proc.join()
        slowest.append(max(t for _, t in inits))
        if slowest[-1] > 2:
            print(f"launch {i}: slow init, per rank {[(r, round(t, 3)) for r, t in inits]}", flush=True)
        del store
    ordered = sorted(slowest)
    print(f"{'nbddp' if a.nbddp_store else 'torch'} store, {a.addr}: {a.launches} launches, "
          f"{sum(t > 2 for t in slowest)} slow; slowest rank's init: median {statistics.median(slowest):.3f} s, "
          f"p95 {ordered[max(0, int(0.95 * len(ordered)) - 1)]:.3f} s, max {ordered[-1]:.3f} s")


if __name__ == "__main__":
    main()
