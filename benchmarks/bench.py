"""Per-cell overhead of %%ddp, side by side with what a user would otherwise use, in one run.

Every figure is a client-side time (execute request sent → kernel idle, what a notebook user
feels) measured in a real Jupyter kernel, except torchrun, which is a whole process started from
a terminal. Median / min / max of repeated runs after a warm-up. Peers that are not installed are
reported as missing, never estimated.

    .venv/bin/python benchmarks/bench.py            # ranks 1,2,4,8, 5 repeats
    .venv/bin/python benchmarks/bench.py --quick    # ranks 2,4, 3 repeats
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from kernel import Kernel  # noqa: E402

TRIVIAL = "pass"
ALLREDUCE = textwrap.dedent("""\
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    dist.destroy_process_group()""")
PRINTS = 20000
FLOOD = f"import os\nr = os.environ.get('RANK', '0')\nfor i in range({PRINTS}):\n    print(r, i)"
TRAIN = textwrap.dedent("""\
    import os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    def step():
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    for _ in range(20):
        step()
    dist.barrier(); t0 = time.perf_counter()
    for _ in range(N_STEPS):
        step()
    dist.barrier(); rate = N_STEPS / (time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(f"STEPS_PER_S {rate:.2f}")
    dist.destroy_process_group()""")


ACCELERATE_HANG_S = 60


class Hung(Exception):
    pass


def stats(times):
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


THINK_S = 0.5  # a (short) pause between cells, as a user reading the output makes; untimed


def timed(fn, repeats, warmup=1, pause=THINK_S):
    """Median/min/max of ``repeats`` calls after ``warmup``, with ``pause`` seconds between
    calls (every peer alike; nbddp forks its spare processes for the next cell in such a pause)."""
    times = []
    for i in range(warmup + repeats):
        if pause:
            time.sleep(pause)
        t = fn()
        if i >= warmup:
            times.append(t)
    return stats(times)


class Bench:
    def __init__(self, ranks, repeats):
        self.ranks, self.repeats = ranks, repeats
        self.rows = {}   # (case, n) -> {peer: stats | str}
        self.k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-bench-"))
        self.k.ok("%load_ext nbddp")
        self.tmp = tempfile.mkdtemp(prefix="nbddp-bench-scripts-")

    def put(self, case, n, peer, value):
        self.rows.setdefault((case, n), {})[peer] = value
        shown = f"{value['median']:.4f} s" if isinstance(value, dict) else value
        print(f"  {case:>10} n={n} {peer:>14}: {shown}", flush=True)

    def cell(self, code):
        def run():
            return self.k.ok(code, timeout=600).elapsed
        return run

    # ------------------------------------------------------------- peers
    def ddp_fresh(self, n):
        self.put("trivial", n, "ddp fresh", timed(self.cell(f"%%ddp -n {n} --output text\n{TRIVIAL}"), self.repeats))
        self.put("allreduce", n, "ddp fresh", timed(self.cell(f"%%ddp -n {n} --output text\n{ALLREDUCE}"), self.repeats))
        # the same cells back to back: the spares for the next cell are still being forked
        for case, code in (("trivial", TRIVIAL), ("allreduce", ALLREDUCE)):
            self.put(case, n, "ddp fresh, no pause",
                     timed(self.cell(f"%%ddp -n {n} --output text\n{code}"), self.repeats, pause=0))

    def pool_available(self):
        reply = self.k.ok("print('ddp_pool' in get_ipython().magics_manager.magics['line'])")
        return reply.stdout.strip() == "True"

    def ddp_pool(self, n):
        if not self.pool_available():
            self.put("trivial", n, "ddp pool", "pool: not available")
            return
        self.k.ok(f"%ddp_pool start -n {n} --output text")
        try:
            self.put("trivial", n, "ddp pool", timed(self.cell(f"%%ddp\n{TRIVIAL}"), self.repeats))
            self.k.ok("%%ddp\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')")
            self.put("allreduce", n, "ddp pool", timed(self.cell("%%ddp\nt = torch.ones(1); dist.all_reduce(t)"), self.repeats))
        finally:
            self.k.ok("%ddp_pool stop")

    def torchrun(self, n):
        paths = {}
        for case, code in (("trivial", TRIVIAL), ("allreduce", ALLREDUCE)):
            paths[case] = os.path.join(self.tmp, f"{case}.py")
            with open(paths[case], "w") as f:
                f.write(code + "\n")

        def run(path):
            def go():
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc-per-node={n}", path], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                return time.perf_counter() - t0
            return go
        reps = max(3, self.repeats // 2)
        for case, path in paths.items():
            self.put(case, n, "torchrun", timed(run(path), reps, warmup=0))

    def accelerate(self, n):
        try:
            import accelerate  # noqa: F401
        except ImportError:
            self.put("allreduce", n, "accelerate", "not installed")
            return
        # In its own kernel, as its users run it: notebook_launcher forks the whole kernel, and
        # in a kernel where nbddp had run, a forked rank deadlocked in libc now and then here.
        self.acc = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-bench-acc-"))
        try:
            self._accelerate(n)
        finally:
            self.acc.shutdown()

    def _accelerate(self, n):
        self.acc.ok(textwrap.dedent("""\
            from accelerate import notebook_launcher
            def _acc_allreduce():
                import torch, torch.distributed as dist
                dist.init_process_group("gloo")
                t = torch.ones(1); dist.all_reduce(t)
                dist.destroy_process_group()
            def _acc_trivial():
                pass"""))
        for case, fn in (("trivial", "_acc_trivial"), ("allreduce", "_acc_allreduce")):
            code = f"notebook_launcher({fn}, num_processes={n})"

            def run():
                # notebook_launcher forks the (multi-threaded) kernel; a forked rank can hang.
                # Such a run is reported as hung, its processes killed, never timed.
                try:
                    reply = self.acc.execute(code, timeout=ACCELERATE_HANG_S)
                except TimeoutError:
                    self.kill_forked_kernels()
                    self.acc.execute("pass", timeout=60)  # wait for the failed cell to end
                    raise Hung()
                if reply.error:
                    raise RuntimeError(f"{reply.error['ename']}: {reply.error['evalue'][:80]}")
                return reply.elapsed
            try:
                self.put(case, n, "accelerate", timed(run, self.repeats, warmup=1))
            except Hung:
                self.put(case, n, "accelerate", f"hung (a run did not finish in {ACCELERATE_HANG_S} s)")
            except RuntimeError as exc:
                self.put(case, n, "accelerate", f"failed: {exc}")

    def kill_forked_kernels(self):
        """Processes notebook_launcher forked from the kernel (they show the kernel's cmdline)."""
        for proc in self.acc.descendants():
            try:
                if proc.ppid() == self.acc.pid and "ipykernel" in " ".join(proc.cmdline()):
                    proc.kill()
            except Exception:
                pass

    def ipyparallel(self, n):
        try:
            import ipyparallel  # noqa: F401
        except ImportError:
            self.put("trivial", n, "ipyparallel", "not installed")
            return
        self.k.ok("_cluster = None")
        reply = self.k.execute(textwrap.dedent(f"""\
            import ipyparallel as ipp, socket
            _cluster = ipp.Cluster(n={n}, ip="127.0.0.1", log_level=40)
            _rc = _cluster.start_and_connect_sync(activate=True)
            _rc.wait_for_engines({n}, timeout=300)
            with socket.socket() as _s:
                _s.bind(("127.0.0.1", 0)); _port = _s.getsockname()[1]
            for _i, _e in enumerate(_rc):
                _e.apply_sync(lambda i, p, w: __import__("os").environ.update(
                    RANK=str(i), WORLD_SIZE=str(w), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(p)), _i, _port, {n})"""),
            timeout=600)
        try:
            if reply.error:
                self.put("trivial", n, "ipyparallel", f"failed: {reply.error['ename']}: {reply.error['evalue'][:80]}")
                return
            self.put("trivial", n, "ipyparallel", timed(self.cell(f"%%px\n{TRIVIAL}"), self.repeats))
            self.k.ok("%%px\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')", timeout=300)
            self.put("allreduce", n, "ipyparallel", timed(self.cell("%%px\nt = torch.ones(1); dist.all_reduce(t)"), self.repeats))
        finally:
            self.k.execute("_cluster is not None and _cluster.stop_cluster_sync()", timeout=120)

    def spawn(self, n):
        self.k.ok(textwrap.dedent(f"""\
            import multiprocess, socket
            def _spawn_job(rank, port, world):
                import os, torch, torch.distributed as dist
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                dist.init_process_group("gloo"); t = torch.ones(1); dist.all_reduce(t); dist.destroy_process_group()
            def _spawn_run(world):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
                ctx = multiprocess.get_context("spawn")
                ps = [ctx.Process(target=_spawn_job, args=(r, port, world)) for r in range(world)]
                [p.start() for p in ps]; [p.join() for p in ps]
                assert all(p.exitcode == 0 for p in ps)"""))
        reps = max(3, self.repeats // 2)
        self.put("allreduce", n, "mp spawn", timed(self.cell(f"_spawn_run({n})"), reps, warmup=0))

    def flood(self):
        n = 4
        def ddp():
            reply = self.k.ok(f"%%ddp -n {n} --output text --idle-warning 600\n{FLOOD}", timeout=600)
            got = len(re.findall(r"^\[rank\d\]:\d \d+$", reply.stdout, re.M))
            assert got == n * PRINTS, f"{got} of {n * PRINTS} lines arrived"
            return reply.elapsed
        def local():
            reply = self.k.ok(f"for r in range({n}):\n    for i in range({PRINTS}):\n        print(r, i)", timeout=600)
            assert reply.stdout.count("\n") == n * PRINTS
            return reply.elapsed
        self.put("prints", n, "ddp fresh", timed(ddp, max(3, self.repeats // 2)))
        self.put("prints", n, "local cell", timed(local, max(3, self.repeats // 2)))

    def training(self, n=2, steps=300):
        code = TRAIN.replace("N_STEPS", str(steps))
        rates = {"ddp": [], "torchrun": []}
        path = os.path.join(self.tmp, "train.py")
        with open(path, "w") as f:
            f.write(code + "\n")
        for _ in range(3):
            out = self.k.ok(f"%%ddp -n {n} --output text\n{code}", timeout=600).stdout
            rates["ddp"].append(float(re.search(r"STEPS_PER_S ([\d.]+)", out).group(1)))
            out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  f"--nproc-per-node={n}", path], check=True, capture_output=True, text=True).stdout
            rates["torchrun"].append(float(re.search(r"STEPS_PER_S ([\d.]+)", out).group(1)))
        self.train = {k: statistics.median(v) for k, v in rates.items()}
        print(f"  training steps/s: %%ddp {self.train['ddp']:.1f}, torchrun {self.train['torchrun']:.1f}", flush=True)

    def profile(self, n=4, repeats=5):
        """Where one fresh %%ddp cell's time goes (benchmarks/phases.py wraps nbddp's steps)."""
        self.k.ok(f"import sys; sys.path.insert(0, {HERE!r}); import phases; phases.install()")
        body = textwrap.dedent("""\
            import time; print("T body", time.perf_counter(), flush=True)
            import torch.distributed as dist
            dist.init_process_group("gloo"); print("T init", time.perf_counter(), flush=True)
            t = __import__("torch").ones(1); dist.all_reduce(t); print("T reduce", time.perf_counter(), flush=True)
            dist.destroy_process_group(); print("T end", time.perf_counter(), flush=True)""")
        rows = []
        for i in range(repeats + 1):
            self.k.ok("phases.reset()")
            time.sleep(THINK_S)
            reply = self.k.ok(f"%%ddp -n {n} --output text\n{body}")
            got = self.k.ok("import json; print(json.dumps([phases.summary(), phases.STAMPS]))").stdout
            spans, stamps = __import__("json").loads(got)
            marks = {}
            for m in re.finditer(r"^\[rank\d\]:T (\w+) ([\d.]+)$", reply.stdout, re.M):
                marks.setdefault(m.group(1), []).append(float(m.group(2)))
            t0 = stamps["start_all.start"]
            spans["client"] = reply.elapsed
            spans["first body"] = min(marks["body"]) - t0          # fork → cell code runs
            spans["last body"] = max(marks["body"]) - t0
            spans["rendezvous"] = max(marks["init"]) - max(marks["body"])
            spans["all_reduce"] = max(marks["reduce"]) - max(marks["init"])
            spans["destroy"] = max(marks["end"]) - max(marks["reduce"])
            spans["exit seen"] = stamps["pump.end"] - max(marks["end"])  # interpreter exit + reap
            if i:
                rows.append(spans)
        self.profile_rows = {k: statistics.median(r[k] for r in rows if k in r) for k in rows[0]}
        print("  profile (median s): " + ", ".join(f"{k} {v:.4f}" for k, v in self.profile_rows.items()), flush=True)

    # ------------------------------------------------------------- run
    def run(self):
        try:
            for n in self.ranks:
                print(f"ranks = {n}", flush=True)
                for peer in (self.ddp_fresh, self.ddp_pool, self.torchrun, self.accelerate,
                             self.ipyparallel, self.spawn):
                    try:
                        peer(n)
                    except Exception as exc:  # one broken peer must not hide the others
                        self.put("allreduce", n, peer.__name__, f"failed: {type(exc).__name__}: {str(exc)[:100]}")
            for step in (self.flood, self.training, self.profile):
                try:
                    step()
                except Exception as exc:
                    print(f"  {step.__name__} failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            self.k.shutdown()


PEERS = ["ddp fresh", "ddp fresh, no pause", "ddp pool", "torchrun", "accelerate", "ipyparallel", "mp spawn", "local cell"]


def report(bench: Bench, path_md: str, path_png: str) -> str:
    os.makedirs(os.path.dirname(path_md), exist_ok=True)
    load = os.getloadavg()
    import torch
    lines = [f"# nbddp benchmark — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, load "
             f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; Python {platform.python_version()}, torch {torch.__version__}",
             "", "Median seconds per cell (min–max), and in brackets the ratio to `%%ddp` fresh "
             "(>1 = slower than %%ddp).", "",
             "| case | ranks | " + " | ".join(PEERS) + " |", "|---|---|" + "---|" * len(PEERS)]
    for (case, n), peers in sorted(bench.rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        base = peers.get("ddp fresh")
        cells = []
        for peer in PEERS:
            v = peers.get(peer)
            if v is None:
                cells.append("")
            elif isinstance(v, str):
                cells.append(" ".join(v.split()).replace("|", "/")[:90])
            else:
                ratio = f" [{v['median'] / base['median']:.2f}×]" if isinstance(base, dict) else ""
                cells.append(f"{v['median']:.3f} ({v['min']:.3f}–{v['max']:.3f}){ratio}")
        lines.append(f"| {case} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets (4 ranks)", ""]

    def med(case, n, peer):
        v = bench.rows.get((case, n), {}).get(peer)
        return v["median"] if isinstance(v, dict) else None

    def verdict(ok):
        return "MET" if ok else "MISSED"
    fresh_b, acc_b, tr_b = med("allreduce", 4, "ddp fresh"), med("allreduce", 4, "accelerate"), med("allreduce", 4, "torchrun")
    if fresh_b and acc_b:
        lines.append(f"- fresh init+all_reduce ≤ 0.5× accelerate: {fresh_b / acc_b:.2f}× → {verdict(fresh_b <= 0.5 * acc_b)}")
    else:
        lines.append("- fresh init+all_reduce vs accelerate: accelerate not measured")
    if fresh_b and tr_b:
        lines.append(f"- fresh init+all_reduce ≥ 20× faster than torchrun: {tr_b / fresh_b:.1f}× → {verdict(tr_b >= 20 * fresh_b)}")
    pool_a, px_a = med("trivial", 4, "ddp pool"), med("trivial", 4, "ipyparallel")
    if pool_a and px_a:
        lines.append(f"- pool trivial cell ≤ 0.5× ipyparallel %%px: {pool_a:.4f} s vs {px_a:.4f} s = {pool_a / px_a:.2f}× → {verdict(pool_a <= 0.5 * px_a)}")
    else:
        lines.append("- pool trivial cell vs ipyparallel: NOT CHECKED (" + ("pool: not available" if not pool_a else "ipyparallel not measured") + ")")
    fl, lo = med("prints", 4, "ddp fresh"), med("prints", 4, "local cell")
    if fl and lo:
        lines.append(f"- 4×{PRINTS} lines all delivered (checked) and ≤ 2× a local cell: {fl / lo:.2f}× → {verdict(fl <= 2 * lo)}")
    tr = getattr(bench, "train", None)
    if tr:
        ratio = tr["ddp"] / tr["torchrun"]
        lines.append(f"- steady-state DDP training, %%ddp / torchrun steps/s: {tr['ddp']:.1f} / {tr['torchrun']:.1f} = "
                     f"{ratio:.3f} (target ≥ 0.97) → {verdict(ratio >= 0.97)}")
    prof = getattr(bench, "profile_rows", None)
    if prof:
        lines += ["", "## Where a fresh 4-rank init+all_reduce cell's time goes (median s)", "",
                  "| " + " | ".join(prof) + " |", "|" + "---|" * len(prof),
                  "| " + " | ".join(f"{v:.4f}" for v in prof.values()) + " |"]
    text = "\n".join(lines) + "\n"
    with open(path_md, "w") as f:
        f.write(text)
    try:
        plot(bench, path_png)
    except Exception as exc:
        print(f"(no plot: {exc})")
    return text


def plot(bench, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = ["trivial", "allreduce"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, case in zip(axes, cases):
        ns = sorted({n for (c, n) in bench.rows if c == case})
        peers = [p for p in PEERS if any(isinstance(bench.rows[(case, n)].get(p), dict) for n in ns)]
        width = 0.8 / max(1, len(peers))
        for i, peer in enumerate(peers):
            xs = [j + i * width for j, n in enumerate(ns) if isinstance(bench.rows[(case, n)].get(peer), dict)]
            ys = [bench.rows[(case, n)][peer]["median"] for n in ns if isinstance(bench.rows[(case, n)].get(peer), dict)]
            ax.bar(xs, ys, width, label=peer)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ns))], [f"{n} ranks" for n in ns])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per cell (median, log)")
        ax.set_title({"trivial": "(a) trivial cell", "allreduce": "(b) init + all_reduce"}[case])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4,8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="ranks 2,4 with 3 repeats")
    p.add_argument("--out", default=HERE)
    a = p.parse_args()
    ranks = [2, 4] if a.quick else [int(x) for x in a.ranks.split(",")]
    repeats = 3 if a.quick else a.repeats
    bench = Bench(ranks, repeats)
    bench.run()
    print(report(bench, os.path.join(a.out, "results.md"), os.path.join(a.out, "results.png")))


if __name__ == "__main__":
    main()
