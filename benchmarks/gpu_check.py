"""Everything nbddp checks on a GPU, in one command on a CUDA machine (CI has no GPU, so these run
by hand where one is lent): the GPU tests (tests/kernel/test_gpu.py: a notebook that touched CUDA
first, nccl, two ranks on one GPU, the pool on cuda, --gpus, memory reported, nothing left on the
GPU), the lessons' GPU copies (notebooks/executed.py --gpu), DDP steps/s under %%ddp beside the
same script under torchrun, and a soak of nccl launches from a parent that initialised CUDA.

    python benchmarks/gpu_check.py                      # all four, about 6 minutes on one H100
    python benchmarks/gpu_check.py --only tests,speed   # or some of: tests, lessons, speed, soak

Prints each part's result and writes them to benchmarks/gpu_results.md (GPU, driver, torch, date)."""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

PARTS = ("tests", "lessons", "speed", "soak")

# The speed script: a torchrun user's DDP loop on cuda:LOCAL_RANK, timed inside rank 0 after a
# warm-up, so the figure is the training's, not the launch's.
SPEED = """\
import os, time, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())]
model = DDP(nn.Sequential(*layers).cuda(), device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 4096, device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
for _ in range(20):
    step()
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(STEPS):
    step()
torch.cuda.synchronize()
rate = STEPS / (time.perf_counter() - start)
if dist.get_rank() == 0:
    print(f"steps/s {rate:.2f}")
dist.destroy_process_group()
"""

# The soak's cell: a small DDP run with a DistributedSampler and a rank-0 checkpoint.
SOAK = """\
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
backend = "BACKEND"
dist.init_process_group(backend)
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(dev)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 20, generator=g)
ds = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds))
model = DDP(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    loader.sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad(); nn.functional.mse_loss(model(xb.to(dev)), yb.to(dev)).backward(); opt.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(os.environ["SNAPSHOTS"], "snap.pt"))
dist.destroy_process_group()
"""


def machine() -> str:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True)
    return (f"{datetime.date.today()}, {os.cpu_count()} cores; GPUs: "
            f"{'; '.join(smi.stdout.strip().splitlines()) or 'none'}; torch, CUDA: {probe.stdout.strip()}")


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no driver here
        return 0
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def run_tests() -> str:
    """tests/kernel/test_gpu.py, every test; the summary line and any failure's name."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu", "-v", "-rs",
                          "tests/kernel/test_gpu.py"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    print(out.stdout[-6000:], out.stderr[-2000:], flush=True)
    lines = [line for line in out.stdout.splitlines() if re.search(r"(PASSED|FAILED|SKIPPED|ERROR)", line)]
    return "\n".join(lines[-20:])


def run_lessons() -> str:
    """The lessons with GPU cells (notebooks/executed.py's GPU_LESSONS), run here: docs/lessons/gpu/."""
    out = subprocess.run([sys.executable, "notebooks/executed.py", "--gpu"], cwd=ROOT,
                         capture_output=True, text=True, timeout=1500)
    print(out.stdout[-4000:], out.stderr[-4000:], flush=True)
    return f"exit {out.returncode}: " + (out.stdout.strip().splitlines() or [""])[-1]


def _rate(text: str) -> float:
    found = re.findall(r"steps/s ([\d.]+)", text)
    if not found:
        raise RuntimeError(f"no steps/s in: {text[-2000:]}")
    return float(found[-1])


def run_speed(n: int, repeats: int, steps: int) -> str:
    """DDP steps/s of the same script: %%ddp in a real kernel, then torchrun --standalone."""
    script = SPEED.replace("STEPS", str(steps))
    folder = tempfile.mkdtemp(prefix="nbddp-gpu-speed-")
    path = os.path.join(folder, "speed.py")
    with open(path, "w") as f:
        f.write(script)
    kernel = Kernel(cwd=folder).load_nbddp()
    ours, theirs = [], []
    try:
        for _ in range(repeats):  # alternated, so a drift of the machine touches both alike
            reply = kernel.ok(f"%%ddp -n {n} --backend nccl --output text\n{script}", timeout=600)
            ours.append(_rate(reply.stdout))
            out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={n}", path], capture_output=True, text=True, timeout=600)
            theirs.append(_rate(out.stdout + out.stderr))
    finally:
        kernel.shutdown()
    a, b = statistics.median(ours), statistics.median(theirs)
    return (f"-n {n}: %%ddp {a:.2f} steps/s, torchrun {b:.2f} steps/s, ratio {a / b:.3f} "
            f"(medians of {repeats}; all: {ours} vs {theirs})")


def run_soak(times: int) -> str:
    """nccl launches, and gloo launches from a parent (this process) that initialised CUDA."""
    import torch

    import nbddp

    torch.ones(1, device="cuda")  # as a notebook that touched CUDA before launching
    os.environ["SNAPSHOTS"] = tempfile.mkdtemp(prefix="nbddp-gpu-soak-")
    lines = []
    for label, n, backend in (("nccl, 1 rank", 1, "nccl"), ("gloo, 4 ranks, parent on CUDA", 4, "gloo")):
        bad, start = [], time.monotonic()
        for i in range(times):
            r = nbddp.run(SOAK.replace("BACKEND", backend), n=n, timeout=120, check=False, idle_warning=0, sinks=[])
            if not all(x.state == "ok" for x in r.ranks):
                bad.append((i, [(x.rank, x.state, x.cause[:200]) for x in r.ranks]))
        lines.append(f"{label}: {times - len(bad)} of {times} ok in {time.monotonic() - start:.1f} s"
                     + (f"; failed: {bad}" if bad else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    p.add_argument("--repeats", type=int, default=3, help="speed: runs of each launcher (median)")
    p.add_argument("--steps", type=int, default=200, help="speed: timed steps in each run")
    p.add_argument("--soak", type=int, default=10, help="soak: launches of each kind")
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"--only: unknown part(s) {','.join(unknown)}; choose among {','.join(PARTS)}")
    if gpu_count() == 0:
        print("gpu_check: no NVIDIA GPU here (nvidia-smi lists none); run it on a GPU machine", file=sys.stderr)
        return 2
    report = [f"# GPU check\n\n{machine()}\n"]
    for part in parts:
        print(f"== {part}", flush=True)
        if part == "tests":
            text = run_tests()
        elif part == "lessons":
            text = run_lessons()
        elif part == "speed":
            sizes = sorted({1, min(gpu_count(), 8)})
            text = "\n".join(run_speed(n, args.repeats, args.steps) for n in sizes)
        else:
            text = run_soak(args.soak)
        print(text, flush=True)
        report.append(f"## {part}\n\n```\n{text}\n```\n")
    with open(os.path.join(HERE, "gpu_results.md"), "w") as f:
        f.write("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
