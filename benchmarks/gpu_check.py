"""GPU checks for nbddp on a CUDA machine (run by hand where a GPU exists; not in CI): a kernel-like parent that already
initialised CUDA forks ranks from the forkserver; nccl DDP training with destroy never hangs; gloo soak."""
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import nbddp

print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), flush=True)
x = torch.ones(1, device="cuda")  # the parent (a kernel) has initialised CUDA, as notebooks do
CELL = '''\
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP

class Data(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 20, generator=g); self.y = self.x.sum(1, keepdim=True)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i], self.y[i]

def main():
    backend = "BACKEND"
    dist.init_process_group(backend)
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    ds = Data(256)
    loader = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds))
    model = DDP(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(); nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward(); opt.step()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), f"/tmp/snap{os.getpid()}.pt")
    dist.destroy_process_group()

main()
'''

def soak(label, n, times, backend_line):
    counts, t0 = collections.Counter(), time.time()
    for i in range(times):
        r = nbddp.run(CELL.replace("BACKEND", backend_line), n=n, timeout=60, check=False, idle_warning=0, sinks=[])
        ok = all(x.state == "ok" for x in r.ranks)
        key = "ok" if ok else str([(x.rank, x.state, x.cause[:200]) for x in r.ranks])
        counts[key] += 1
        if key != "ok":
            print(label, i, key, (r.ranks[0].stdout() if hasattr(r.ranks[0], "stdout") else "")[-1500:], flush=True)
    print(label, dict(counts), f"{time.time()-t0:.1f}s", flush=True)

soak("nccl-1rank-cuda", 1, 20, "nccl")
soak("gloo-4rank-cpu-parent-has-cuda", 4, 30, "gloo")
r = nbddp.run("import nbddp, torch; print('backend', nbddp.backend(), 'cuda', torch.cuda.is_available(), "
              "torch.cuda.current_device() if torch.cuda.is_available() else None)",
              n=1, backend="auto", check=False, sinks=[])
print("auto -n1:", r.ranks[0].state, open(r.ranks[0].stdout_path).read().strip())
r = nbddp.run("import nbddp; print('backend', nbddp.backend())", n=2, backend="auto", check=False, sinks=[])
print("auto -n2:", [x.state for x in r.ranks], r.notes)

# Seen 2026-12-04 on one H200 (torch 2.11.0+cu130, 16 cores): nccl-1rank-cuda 20 of 20 ok (28.7 s),
# gloo-4rank-cpu-parent-has-cuda 30 of 30 ok (5.4 s), auto -n1: nccl on cuda:0, auto -n2 with one
# GPU: gloo with the note saying why.
