"""On a real NVIDIA GPU (skipped, with the reason, anywhere else; CI is CPU-only): a notebook that
touched CUDA before nbddp still launches nccl ranks (the launcher failure most reported against
notebook launchers), and a cell trains as the same script does under torchrun; two ranks on one
GPU get a one-line hint, and auto picks gloo with its note; the pool keeps CUDA state across
cells; --gpus reaches the rank as CUDA_VISIBLE_DEVICES; each rank's CUDA memory is reported to
the byte; no rank holds GPU memory once its cell or pool has ended. One command runs it all on a
GPU machine: ``python benchmarks/gpu_check.py``."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from support.helpers import wait_gone
from support.kernel import Kernel

MiB = 1 << 20


def _gpus() -> list[str]:
    """The GPUs nvidia-smi lists (their indices), [] without a driver or a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _why_not() -> str | None:
    """Why these tests cannot run here, or None where they can."""
    if not _gpus():
        return "no NVIDIA GPU here (nvidia-smi lists none): on a GPU machine, python benchmarks/gpu_check.py runs them"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    if not probe.stdout.strip().endswith("True"):
        return f"this torch cannot use the GPU ({probe.stdout.strip() or probe.stderr.strip()[-200:]}): a CPU build?"
    return None


WHY_NOT = _why_not()
GPUS = _gpus() if WHY_NOT is None else []
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]

# A training step as a torchrun user writes it: bind first, nccl with device_id, DDP on the device.
TRAIN = """\
import os, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).cuda(), device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 32, generator=g).cuda()
y = x.sum(1, keepdim=True)
losses = []
for step in range(20):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("on", next(model.parameters()).device, dist.get_backend(), "name", __name__)
print(f"losses {losses[0]:.4f} {losses[-1]:.4f}")
dist.destroy_process_group()
"""


def _memory_used_mib() -> list[int]:
    """Each GPU's memory in use, as the driver counts it (every process's contexts included)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True)
    return [int(v) for v in out.stdout.split()]


def _back_to(baseline: list[int], slack_mib: int = 64, timeout: float = 20) -> list[int]:
    """Wait until no GPU holds more than ``baseline`` (+ slack): a rank left alive holds its CUDA
    context (hundreds of MiB), which nvidia-smi counts even where it cannot name the pid (a
    container's own pid namespace)."""
    deadline = time.monotonic() + timeout
    while True:
        now = _memory_used_mib()
        if all(n <= b + slack_mib for n, b in zip(now, baseline, strict=True)) or time.monotonic() > deadline:
            return now


def _compute_pids() -> set[int]:
    """The pids nvidia-smi says hold a CUDA context (none where a container hides them)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60, check=True)
    return {int(v) for v in out.stdout.split() if v.isdigit()}


def _under(kernel) -> set[int]:
    """Every process the kernel started, nbddp's forkserver and ranks included, at any depth."""
    return {p.pid for p in psutil.Process(kernel.pid).children(recursive=True)}


def _rank_pids(kernel) -> list[int]:
    return json.loads(kernel.ok("import json; print(json.dumps([r.pid for r in _ddp.ranks]))").stdout)


def _report(reply) -> str:
    """What a text-mode cell showed: the ranks' lines, then the transcript of their states."""
    return reply.stdout + "".join(o.get("data", {}).get("text/plain", "") for o in reply.outputs)


def _gpu_memory(kernel):
    """What the last cell's rank 0 reported of its CUDA memory (RankResult.gpu_memory)."""
    return json.loads(kernel.ok("import json; print(json.dumps(_ddp.ranks[0].gpu_memory))").stdout)


def _cuda_kernel(tmp_path) -> Kernel:
    """A kernel whose notebook initialised CUDA before loading nbddp, as a learner's often has."""
    k = Kernel(cwd=str(tmp_path))
    reply = k.ok("import torch\nx = torch.zeros(1, device='cuda')\nprint('initialised', torch.cuda.is_initialized())")
    assert "initialised True" in reply.stdout
    k.ok("%load_ext nbddp")
    return k


@pytest.fixture
def cuda_kernel(tmp_path):
    k = _cuda_kernel(tmp_path)
    baseline = _memory_used_mib()
    yield k
    try:
        k.execute("%ddp_pool stop")
        left = _back_to(baseline)
        holding = _compute_pids() & _under(k)
        assert not holding, f"processes the kernel started still hold a CUDA context: {holding}"
        grew = [n - b for n, b in zip(left, baseline, strict=True)]
        assert max(grew) <= 64, f"GPU memory {left} MiB after the test, {baseline} before: a rank still holds it"
    finally:
        k.shutdown()


def test_a_notebook_that_touched_cuda_first_trains_on_nccl_as_torchrun_does(cuda_kernel, tmp_path):
    reply = cuda_kernel.ok("%%ddp -n 1 --backend nccl --output text\n" + TRAIN, timeout=300)
    assert "on cuda:0 nccl name __main__" in reply.stdout, reply.text
    ours = re.search(r"losses (\S+) (\S+)", reply.stdout)
    assert ours and float(ours[2]) < float(ours[1]) / 2, reply.stdout
    shown = _report(reply)
    assert re.search(r"rank 0: cuda:0 peak [\d.]+ [KM]iB, [\d.]+ [KM]iB held at the end", shown), shown
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    theirs = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                             str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    assert "on cuda:0 nccl name __main__" in theirs.stdout
    assert re.search(r"losses (\S+) (\S+)", theirs.stdout)[0] == ours[0], (theirs.stdout, reply.stdout)


def test_two_ranks_on_one_gpu_get_a_line_not_a_wall_of_nccl(cuda_kernel):
    k = cuda_kernel
    refused = k.execute("%%ddp -n 2 --gpus 0 --backend nccl\npass")
    assert refused.status == "error"
    said = " ".join((refused.text + str(refused.outputs)).split())
    assert "2 ranks per node but 1 GPU chosen (nccl needs one GPU per rank)" in said, said
    auto = k.ok("%%ddp -n 2 --gpus 0 --output text\nimport torch.distributed as dist, nbddp\n"
                "dist.init_process_group(nbddp.backend()); print('backend', dist.get_backend())")
    assert "backend hint gloo, not nccl: 2 ranks per node but 1 GPU chosen" in " ".join(auto.text.split())
    assert auto.stdout.count("backend gloo") >= 3  # the launch line and each rank
    # the cell insists on nccl with both ranks on cuda:0, as code without set_device does
    dup = k.execute("%%ddp -n 2 --gpus 0 --backend gloo --output text --timeout 180\n"
                    "import torch, torch.distributed as dist\ndist.init_process_group('nccl')\n"
                    "t = torch.ones(1, device='cuda'); dist.all_reduce(t)", timeout=300)
    assert dup.error is not None, dup.text
    text = dup.plain
    assert "its own GPU" in text, text[-3000:]  # the duplicate-GPU hint, or the invalid-usage one
    assert "Traceback" not in dup.error["evalue"]


def test_the_pool_keeps_cuda_tensors_across_cells_and_reports_each_cells_peak(cuda_kernel):
    k = cuda_kernel
    k.ok("%ddp_pool start -n 1 --output text")
    k.ok("%%ddp\nimport os, torch, torch.distributed as dist\nlr = int(os.environ['LOCAL_RANK'])\n"
         "torch.cuda.set_device(lr)\ndist.init_process_group('nccl', device_id=torch.device('cuda', lr))\n"
         "w = torch.ones(1024, 1024, device='cuda')\nbig = torch.empty(16 * 1024 * 1024, device='cuda'); del big")
    pool_pids = json.loads(k.ok("import json; _p = type(get_ipython().find_magic('ddp_pool').__self__).pool\n"
                                "print(json.dumps([r.result.pid for r in _p.ranks]))").stdout)
    if k.pid in _compute_pids():  # nvidia-smi sees this pid namespace: it must name the pool's rank too
        assert set(pool_pids) <= _compute_pids(), (pool_pids, _compute_pids())
    reply = k.ok("%%ddp\ndist.all_reduce(w)\nprint('sum', w.sum().item(), 'held', torch.cuda.memory_allocated())")
    held = int(re.search(r"held (\d+)", reply.stdout)[1])
    assert "sum 1048576.0" in reply.stdout and held >= 4 * MiB
    entry = _gpu_memory(k)[0]
    assert entry["device"] == 0 and entry["allocated"] == held
    assert entry["peak"] < 64 * MiB, f"the first cell's 64 MiB peak leaked into this cell's: {entry}"
    k.ok("%ddp_pool stop")
    assert not wait_gone(pool_pids, 20), "a pool rank outlived %ddp_pool stop"


def test_gpus_picks_the_device_through_cuda_visible_devices(cuda_kernel):
    last = len(GPUS) - 1
    outside = os.environ.get("CUDA_VISIBLE_DEVICES")
    expected = [p.strip() for p in outside.split(",")][last] if outside else str(last)
    reply = cuda_kernel.ok(f"%%ddp -n 1 --gpus {last} --output text\nimport os, torch\n"
                           "x = torch.ones(1, device='cuda')\n"
                           "print('visible', os.environ['CUDA_VISIBLE_DEVICES'], 'count', torch.cuda.device_count())")
    assert f"visible {expected} count 1" in reply.stdout, reply.stdout
    name = "cuda:0" if expected == "0" else f"cuda:0 (GPU {expected})"
    assert f"rank 0: {name} peak" in _report(reply), _report(reply)


def test_each_ranks_cuda_memory_is_reported_to_the_byte_and_freed_with_it(cuda_kernel):
    k = cuda_kernel
    k.ok("%%ddp -n 1 --output text\nimport torch\nbig = torch.empty(16 * 1024 * 1024, device='cuda')\n"
         "del big\nkept = torch.empty(1024 * 1024, device='cuda')")
    entry = _gpu_memory(k)[0]
    assert (entry["peak"], entry["allocated"]) == (64 * MiB, 4 * MiB), entry
    pids = _rank_pids(k)
    assert not wait_gone(pids, 10)
    cpu = k.ok("%%ddp -n 1 --output text\nimport torch\nprint(torch.ones(2).sum())")
    assert "GPU memory" not in _report(cpu)  # a rank that never touched CUDA says nothing of it
    assert _gpu_memory(k) is None


@pytest.mark.skipif(len(GPUS) < 2, reason="needs 2 GPUs: a hang between two nccl ranks")
def test_a_collective_only_rank_0_calls_times_out_naming_it_and_frees_both_gpus(cuda_kernel):
    reply = cuda_kernel.execute(
        "%%ddp -n 2 --backend nccl --timeout 40 --output text\n" + TRAIN.split("torch.manual_seed")[0]
        + "t = torch.ones(1, device='cuda')\nif dist.get_rank() == 0:\n    dist.all_reduce(t)\n"
        "torch.cuda.synchronize()\nprint('done')", timeout=300)
    assert reply.error is not None and reply.error["ename"] == "DDPTimeout", reply.text[-3000:]
    assert "rank 0" in reply.error["evalue"]
    pids = _rank_pids(cuda_kernel)
    assert not wait_gone(pids, 20)
