"""Seconds per cell of ``--launcher ray`` beside ``--launcher torchrun`` and Ray Train's
``TorchTrainer``, in one run: the cells in one real Jupyter kernel (client side: execute request
sent → kernel idle), the same all_reduce cell:

  torchrun        %%ddp --launcher torchrun -n N
  ray local       %%ddp --launcher ray -n N (a local Ray started and stopped for each cell)
  ray 1 node      %%ddp --launcher ray --ray-address A -n N, a running one-node Ray
  ray 2 nodes     %%ddp --launcher ray --ray-address B --nnodes 2, a running two-node Ray on this machine
  TorchTrainer    Ray Train's TorchTrainer (N workers, no GPU) on the one-node Ray A, from this
                  process: a train function doing the cell's body (one all_reduce of ones) after
                  Ray Train's own process-group setup, timed from ``fit()`` called to returned.

    .venv/bin/python benchmarks/ray_launcher.py [--ranks 2] [--repeats 3]

Median (min–max) of the repeats, interleaved, after one warm-up of each; a run that fails is
not timed, and its row says how many failed and the first one's error.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

CELL = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1); dist.all_reduce(t)
print("sum", t.item())
dist.destroy_process_group()
"""


def trainer_run(address: str, n: int, storage: str) -> Callable[[], float]:
    """One ``TorchTrainer.fit()`` on the running Ray at ``address``, timed call → return."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_loop(config: dict) -> None:  # nested: Ray pickles it by value, not by module
        """The cell's body; the process group is Ray Train's own (gloo, no GPU)."""
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size(), t.item()

    ray.init(address=address, log_to_driver=False)
    runs = iter(range(1_000_000))

    def run() -> float:
        trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=n, use_gpu=False),
                               run_config=RunConfig(storage_path=storage, name=f"run{next(runs)}"))
        start = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - start
    return run


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
    cells = {
        "torchrun": f"%%ddp --launcher torchrun -n {n} --output text\n" + CELL,
        "ray local": f"%%ddp --launcher ray -n {n} --output text\n" + CELL,
        "ray 1 node": f"%%ddp --launcher ray --ray-address {one.address} -n {n} --output text\n" + CELL,
        "ray 2 nodes": f"%%ddp --launcher ray --ray-address {two.address} --nnodes 2 "
                       f"--nproc-per-node {max(1, n // 2)} --output text\n" + CELL,
    }
    cases: dict[str, Callable[[], float]] = {
        name: (lambda code=code: timed(kernel, code)) for name, code in cells.items()}
    storage = tempfile.mkdtemp(prefix="nbddp-raytrain-")
    errors: dict[str, list[str]] = {name: [] for name in [*cells, "TorchTrainer"]}
    try:
        cases["TorchTrainer"] = trainer_run(one.address, n, storage)
    except Exception as exc:  # ray[train] missing, or Ray refused the driver: the row says which
        errors["TorchTrainer"].append(f"{type(exc).__name__}: {exc}")
    times: dict[str, list[float]] = {name: [] for name in errors}
    load_before = os.getloadavg()[0]
    try:
        for round_ in range(args.repeats + 1):  # round 0: the warm-up
            for name, case in cases.items():
                try:
                    took = case()
                except Exception as exc:  # a failed run is counted and said, never timed
                    errors[name].append(f"{type(exc).__name__}: {exc}")
                    continue
                if round_:
                    times[name].append(took)
    finally:
        kernel.shutdown()
        if "TorchTrainer" in cases:
            import ray
            ray.shutdown()
        one.shutdown()
        two.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    print(f"{n} ranks, {os.cpu_count()} cores, load {load_before:.1f} at the start and "
          f"{os.getloadavg()[0]:.1f} at the end; seconds per cell, median (min–max) of {args.repeats}:")
    for name, got in times.items():
        row = f"{statistics.median(got):6.1f} ({min(got):.1f}–{max(got):.1f})" if got else "   -  "
        if errors[name]:
            row += f"; {len(errors[name])} of {args.repeats + 1} runs (warm-up too) failed, the first: "
            row += errors[name][0]
        print(f"  {name:<12} {row}")


if __name__ == "__main__":
    main()
