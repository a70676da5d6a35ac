"""What typical training cells import on first use in a rank, after the forkserver's preload:
this process imports the preload list, then forks one child per snippet (as the forkserver
forks a rank) and reports the child's time and the modules the snippet added to sys.modules.

    .venv/bin/python benchmarks/first_use.py                     # after nbddp/forkserver/preload.py's list
    .venv/bin/python benchmarks/first_use.py --preload torch,torch.distributed,torch.nn

Each row also says whether CUDA was initialised (it must stay False: nbddp/forkserver/preload.py).
"""
import argparse
import importlib
import json
import os
import socket
import sys
import time

INIT = ("import os, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(THE_PORT), RANK='0', WORLD_SIZE='1')\n"
        "dist.init_process_group('gloo')\n")
SNIPPETS = {
    "ddp + sgd": INIT + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                        "m = DDP(torch.nn.Linear(10, 1)); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                        "for _ in range(3):\n    opt.zero_grad(); m(torch.randn(4, 10)).sum().backward(); opt.step()\n"
                        "dist.destroy_process_group()",
    "adamw step": "m = torch.nn.Linear(10, 1); opt = torch.optim.AdamW(m.parameters())\n"
                  "m(torch.randn(2, 10)).sum().backward(); opt.step()",
    "lr_scheduler": "m = torch.nn.Linear(10, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                    "s = torch.optim.lr_scheduler.StepLR(opt, 1); opt.step(); s.step()",
    "autocast + GradScaler": "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                             "    torch.nn.Linear(10, 1)(torch.randn(2, 10)).sum()\n"
                             "from torch.amp import GradScaler\nGradScaler('cpu')",
    "DataLoader + DistributedSampler": "from torch.utils.data import DataLoader, TensorDataset\n"
                                       "from torch.utils.data.distributed import DistributedSampler\n"
                                       "ds = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))\n"
                                       "s = DistributedSampler(ds, num_replicas=2, rank=0)\n"
                                       "for e in range(2):\n    s.set_epoch(e)\n"
                                       "    for x, y in DataLoader(ds, batch_size=8, sampler=s): pass",
    "fully_shard": "from torch.distributed.fsdp import fully_shard",
    "distributed.checkpoint": "import torch.distributed.checkpoint",
    "profiler": "import torch.profiler\nwith torch.profiler.profile():\n    torch.ones(3).sum()",
    "torch.save/load": "import io; b = io.BytesIO(); torch.save({'a': torch.ones(2)}, b); b.seek(0); torch.load(b)",
}


def child(name, w):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch
    before = set(sys.modules)
    t0 = time.perf_counter()
    exec(SNIPPETS[name].replace("THE_PORT", str(port)), {"torch": torch})
    new = sorted(set(sys.modules) - before)
    roots = sorted({m for m in new if not any(m.startswith(o + ".") for o in new)})
    os.write(w, json.dumps({"t": time.perf_counter() - t0, "n": len(new), "roots": roots,
                            "cuda": bool(torch.cuda._initialized)}).encode())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preload", help="comma-separated modules (default: nbddp/forkserver/preload.py's list)")
    a = p.parse_args()
    if a.preload:
        names = a.preload.split(",")
    else:
        from nbddp.forkserver.preload import NAMES
        names = [n for n in NAMES if n != "nbddp.forkserver.serve"]  # no SIGUSR2 handler in a script
    t0 = time.perf_counter()
    for name in names:
        importlib.import_module(name)
    print(f"preload of {len(names)} modules: {time.perf_counter() - t0:.2f} s")
    for name in SNIPPETS:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                child(name, w)
            except BaseException as exc:  # shown by the parent
                os.write(w, json.dumps({"error": repr(exc)}).encode())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 1 << 20):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        d = json.loads(data)
        if "error" in d:
            print(f"{name:>32}: failed: {d['error']}")
            continue
        shown = " ".join(d["roots"][:12]) + (" ..." if len(d["roots"]) > 12 else "")
        print(f"{name:>32}: {d['t']:.3f} s, {d['n']:4d} new modules, CUDA initialised: {d['cuda']}  {shown}")


if __name__ == "__main__":
    main()
