"""Seconds per cell of ``--launcher ray`` beside ``--launcher torchrun``, in one run and one real
Jupyter kernel (client side: execute request sent → kernel idle), the same all_reduce cell:

  torchrun        %%ddp --launcher torchrun -n N
  ray local       %%ddp --launcher ray -n N (a local Ray started and stopped for each cell)
  ray 1 node      %%ddp --launcher ray --ray-address A -n N, a running one-node Ray
  ray 2 nodes     %%ddp --launcher ray --ray-address B --nnodes 2, a running two-node Ray on this machine
  TorchTrainer    Ray Train's TorchTrainer running the same all_reduce as a function on the
                  two-node Ray (where ray[train] is installed; else said so)

    .venv/bin/python benchmarks/ray_launcher.py [--ranks 2] [--repeats 3]

Median (min–max) of the repeats, interleaved, after one warm-up of each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

CELL = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t)
print("sum", t.item())
dist.destroy_process_group()
"""
TRAINER = """
import time, ray
t0 = time.perf_counter()
def loop(config):
    import torch, torch.distributed as dist
    t = torch.ones(1); dist.all_reduce(t)
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
TorchTrainer(loop, scaling_config=ScalingConfig(num_workers={n}, use_gpu=False,
             placement_strategy="SPREAD")).fit()
print("took", time.perf_counter() - t0)
"""


def timed(kernel: Kernel, code: str) -> float:
    start = time.perf_counter()
    reply = kernel.execute(code, timeout=600)
    took = time.perf_counter() - start
    if reply.error:
        raise RuntimeError(reply.text[-2000:])
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = args.ranks
    from ray.cluster_utils import Cluster

    one = Cluster(initialize_head=True, head_node_args={"num_cpus": n, "include_dashboard": False})
    two = Cluster(initialize_head=True, head_node_args={"num_cpus": n, "include_dashboard": False})
    two.add_node(num_cpus=n)
    one.wait_for_nodes()
    two.wait_for_nodes()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    kernel = Kernel(env=env).load_nbddp()
    cases = {
        "torchrun": f"%%ddp --launcher torchrun -n {n} --output text\n" + CELL,
        "ray local": f"%%ddp --launcher ray -n {n} --output text\n" + CELL,
        "ray 1 node": f"%%ddp --launcher ray --ray-address {one.address} -n {n} --output text\n" + CELL,
        "ray 2 nodes": f"%%ddp --launcher ray --ray-address {two.address} --nnodes 2 "
                       f"--nproc-per-node {max(1, n // 2)} --output text\n" + CELL,
    }
    try:
        import ray.train.torch  # noqa: F401
        kernel.ok(f"import ray; ray.init(address={two.address!r}, log_to_driver=False)")
        cases["TorchTrainer"] = TRAINER.format(n=n)
    except Exception as exc:
        print(f"TorchTrainer: not measured ({type(exc).__name__}: {exc}; it needs ray[train])")
    times: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for code in cases.values():  # warm-up
            timed(kernel, code)
        for _ in range(args.repeats):
            for name, code in cases.items():
                times[name].append(timed(kernel, code))
    finally:
        kernel.shutdown()
        one.shutdown()
        two.shutdown()
    print(f"{n} ranks, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; seconds per cell, "
          f"median (min–max) of {args.repeats}:")
    for name, got in times.items():
        print(f"  {name:<12} {statistics.median(got):6.1f} ({min(got):.1f}–{max(got):.1f})")


if __name__ == "__main__":
    main()
