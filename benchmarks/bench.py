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
import math
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

import first_cell  # noqa: E402 - benchmarks/first_cell.py (the first cell after %load_ext), after the path
from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

TRIVIAL = "pass"
# (d) and (e): what a real training cell does. BODY is the part after the process group exists
# (the persistent peers, pool and ipyparallel, keep their group across cells); FRESH wraps it
# in init_process_group ... destroy_process_group for the peers that start ranks per cell.
DDP_BODY = textwrap.dedent("""\
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Linear(10, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        opt.zero_grad(); model(torch.randn(8, 10)).sum().backward(); opt.step()
        print(f"step {step}", flush=True)""")
LOADER_BODY = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    data = TensorDataset(torch.randn(256, 10), torch.randn(256, 1))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=16, sampler=sampler):
            pass
        print(f"epoch {epoch}", flush=True)""")
BODIES = {"allreduce": "t = torch.ones(1); dist.all_reduce(t)", "ddp": DDP_BODY, "dataloader": LOADER_BODY}


def fresh(body: str) -> str:
    return ('import torch, torch.distributed as dist\ndist.init_process_group("gloo")\n'
            + body + "\ndist.destroy_process_group()")


CASES = {"trivial": TRIVIAL, "allreduce": fresh(BODIES["allreduce"]), "ddp": fresh(DDP_BODY),
         "dataloader": fresh(LOADER_BODY)}
TITLES = {"trivial": "(a) trivial cell", "allreduce": "(b) init + all_reduce + destroy",
          "ddp": "(d) init + DDP(Linear) + 3 SGD steps + destroy",
          "dataloader": "(e) DataLoader + DistributedSampler, 2 epochs", "prints": "(c) 4 × 20,000 prints"}
MARKS = {"ddp": "step 0", "dataloader": "epoch 0"}  # a rank's first line, for the first-output column
TAIL_CELLS = 50
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
    ordered = sorted(times)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "p95": p95,
            "n": len(times)}


THINK_S = 0.5  # a (short) pause between cells, as a user reading the output makes; untimed


def timed(fn, repeats, warmup=1, pause=THINK_S, first=None):
    """Median/min/max of ``repeats`` calls after ``warmup``, with ``pause`` seconds between
    calls (every peer alike; nbddp forks its spare processes for the next cell in such a pause).
    ``fn`` returns seconds, or (seconds, seconds to its first output line); the latter go into
    the list ``first`` when one is given."""
    times = []
    for i in range(warmup + repeats):
        if pause:
            time.sleep(pause)
        t = fn()
        if isinstance(t, tuple):
            t, t_first = t
            if i >= warmup and first is not None and t_first is not None:
                first.append(t_first)
        if i >= warmup:
            times.append(t)
    return stats(times)


class Bench:
    def __init__(self, ranks, repeats, cases=("trivial", "allreduce", "ddp", "dataloader")):
        self.ranks, self.repeats, self.cases = ranks, repeats, list(cases)
        self.rows = {}   # (case, n) -> {peer: stats | str}
        self.first = {}  # (case, n) -> {peer: stats}: execute → first output line
        self.k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-bench-"))
        self.k.ok("%load_ext nbddp")
        self.tmp = tempfile.mkdtemp(prefix="nbddp-bench-scripts-")

    def put(self, case, n, peer, value, first=None):
        self.rows.setdefault((case, n), {})[peer] = value
        shown = f"{value['median']:.4f} s" if isinstance(value, dict) else value
        if first:
            self.first.setdefault((case, n), {})[peer] = stats(first)
            shown += f", first output {statistics.median(first):.4f} s"
        print(f"  {case:>10} n={n} {peer:>20}: {shown}", flush=True)

    def measure(self, case, n, peer, fn, repeats=None, warmup=1, pause=THINK_S):
        """Time ``fn`` (see timed) and record it, with first-output times where it gives them."""
        first = []
        try:
            value = timed(fn, self.repeats if repeats is None else repeats, warmup, pause, first)
        except (RuntimeError, AssertionError, subprocess.SubprocessError) as exc:  # shown in its cell
            self.put(case, n, peer, f"failed: {' '.join(str(exc).split())[:120]}")
            return
        self.put(case, n, peer, value, first)

    def cell(self, code, kernel=None, mark=None):
        """A kernel cell: (client seconds, seconds until ``mark`` (a rank's first line) arrived,
        or None)."""
        k = kernel or self.k
        seen, t0 = [], 0.0

        def on_output(reply):
            if mark and not seen and mark in reply.stdout:
                seen.append(time.monotonic() - t0)

        def run():
            nonlocal t0
            seen.clear()
            t0 = time.monotonic()
            reply = k.execute(code, timeout=600, on_output=on_output)
            if reply.error or reply.status == "error":
                raise RuntimeError(f"{(reply.error or {}).get('ename', 'error')}: {reply.text[-300:]}")
            return reply.elapsed, (seen[0] if seen else None)
        return run

    # ------------------------------------------------------------- peers
    def ddp_fresh(self, n):
        for case in self.cases:
            cell = self.cell(f"%%ddp -n {n} --output text\n{CASES[case]}", mark=MARKS.get(case))
            self.measure(case, n, "ddp fresh", cell)
        # the same cells back to back: the spares for the next cell are still being forked
        for case in ("trivial", "allreduce"):
            if case in self.cases:
                self.measure(case, n, "ddp fresh, no pause",
                             self.cell(f"%%ddp -n {n} --output text\n{CASES[case]}"), pause=0)

    tail_cells = TAIL_CELLS

    def tail(self, n=4, cells=None):
        """(b) as 50 fresh cells in a row (with the pause): the median and p95 (a 5 s stall in
        one cell of 20 shows in the p95)."""
        value = timed(self.cell(f"%%ddp -n {n} --output text\n{CASES['allreduce']}"), cells or self.tail_cells)
        self.put("allreduce tail", n, "ddp fresh", value)

    def pool_available(self):
        reply = self.k.ok("print('ddp_pool' in get_ipython().magics_manager.magics['line'])")
        return reply.stdout.strip() == "True"

    def ddp_pool(self, n):
        if not self.pool_available():
            self.put("trivial", n, "ddp pool", "pool: not available")
            return
        self.k.ok(f"%ddp_pool start -n {n} --output text")
        try:
            if "trivial" in self.cases:
                self.measure("trivial", n, "ddp pool", self.cell(f"%%ddp\n{TRIVIAL}"))
            self.k.ok("%%ddp\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')")
            for case in ("allreduce", "ddp", "dataloader"):
                if case in self.cases:
                    self.measure(case, n, "ddp pool", self.cell(f"%%ddp\n{BODIES[case]}", mark=MARKS.get(case)))
        finally:
            self.k.ok("%ddp_pool stop")

    def torchrun(self, n):
        def run(path, mark):
            def go():
                t0 = time.perf_counter()
                proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         f"--nproc-per-node={n}", path],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                first = None
                for line in proc.stdout:
                    if first is None and mark and mark.encode() in line:
                        first = time.perf_counter() - t0
                if proc.wait() != 0:
                    raise RuntimeError(f"torchrun exited with {proc.returncode}")
                return time.perf_counter() - t0, first
            return go
        reps = max(3, self.repeats // 2)
        for case in self.cases:
            path = os.path.join(self.tmp, f"{case}.py")
            with open(path, "w") as f:
                f.write(CASES[case] + "\n")
            self.measure(case, n, "torchrun", run(path, MARKS.get(case)), repeats=reps, warmup=0)

    def accelerate(self, n):
        try:
            import accelerate  # noqa: F401 - only: is it installed?
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
        defs = ["from accelerate import notebook_launcher"]
        for case in self.cases:
            defs.append(f"def _acc_{case}():\n" + textwrap.indent(CASES[case], "    "))
        self.acc.ok("\n".join(defs))
        for case in self.cases:
            code = f"notebook_launcher(_acc_{case}, num_processes={n})"
            timed_cell = self.cell(code, kernel=self.acc, mark=MARKS.get(case))

            def run(timed_cell=timed_cell):  # this case's cell
                # notebook_launcher forks the (multi-threaded) kernel; a forked rank can hang.
                # Such a run is reported as hung, its processes killed, never timed.
                try:
                    return timed_cell()
                except TimeoutError:
                    self.kill_forked_kernels()
                    self.acc.execute("pass", timeout=60)  # wait for the failed cell to end
                    raise Hung() from None
            try:
                self.measure(case, n, "accelerate", run)
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
            import ipyparallel  # noqa: F401 - only: is it installed?
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
            if "trivial" in self.cases:
                self.measure("trivial", n, "ipyparallel", self.cell(f"%%px\n{TRIVIAL}"))
            self.k.ok("%%px\nimport torch, torch.distributed as dist\ndist.init_process_group('gloo')", timeout=300)
            for case in ("allreduce", "ddp", "dataloader"):
                if case in self.cases:
                    self.measure(case, n, "ipyparallel", self.cell(f"%%px\n{BODIES[case]}", mark=MARKS.get(case)))
        finally:
            self.k.execute("_cluster is not None and _cluster.stop_cluster_sync()", timeout=120)

    def spawn(self, n):
        self.k.ok(textwrap.dedent("""\
            import multiprocess, socket
            def _spawn_job(rank, port, world, code):
                import os
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                exec(code, {"__name__": "__main__"})
            def _spawn_run(world, code):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
                ctx = multiprocess.get_context("spawn")
                ps = [ctx.Process(target=_spawn_job, args=(r, port, world, code)) for r in range(world)]
                [p.start() for p in ps]; [p.join() for p in ps]
                assert all(p.exitcode == 0 for p in ps)"""))
        reps = max(3, self.repeats // 2)
        for case in self.cases:
            if case != "trivial":
                cell = self.cell(f"_spawn_run({n}, {CASES[case]!r})", mark=MARKS.get(case))
                self.measure(case, n, "mp spawn", cell, repeats=reps, warmup=0)

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
    def first_cell(self, n=4, repeats=3):
        """The first %%ddp cell after %load_ext, in new kernels (benchmarks/first_cell.py)."""
        self.first_cell_times = first_cell.measure(n, repeats)
        print("  " + first_cell.summary(self.first_cell_times, n), flush=True)

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
            steps = [self.flood, self.training, self.profile, self.first_cell]
            if "allreduce" in self.cases and 4 in self.ranks:
                steps.insert(0, self.tail)
            for step in steps:
                try:
                    step()
                except Exception as exc:
                    print(f"  {step.__name__} failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            self.k.shutdown()


PEERS = ["ddp fresh", "ddp fresh, no pause", "ddp pool", "torchrun", "accelerate", "ipyparallel", "mp spawn",
         "local cell"]


def table_cell(value, base, digits: int, width: int) -> str:
    """One peer's cell of a results table: median (min–max) [ratio to ``base``], a failure's
    text (at most ``width`` characters, no ``|``), or nothing where it was not measured."""
    if value is None:
        return ""
    if isinstance(value, str):
        return " ".join(value.split()).replace("|", "/")[:width]
    ratio = f" [{value['median'] / base['median']:.2f}×]" if isinstance(base, dict) else ""
    return f"{value['median']:.{digits}f} ({value['min']:.{digits}f}–{value['max']:.{digits}f}){ratio}"


def report(bench: Bench, path_md: str, path_png: str) -> str:
    os.makedirs(os.path.dirname(path_md), exist_ok=True)
    load = os.getloadavg()
    import torch
    lines = [f"# nbddp benchmark — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, load "
             f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; "
             f"Python {platform.python_version()}, torch {torch.__version__}",
             "", "Median seconds per cell (min–max), and in brackets the ratio to `%%ddp` fresh "
             "(>1 = slower than %%ddp).", "",
             "| case | ranks | " + " | ".join(PEERS) + " |", "|---|---|" + "---|" * len(PEERS)]
    order = ["trivial", "allreduce", "prints", "ddp", "dataloader", "allreduce tail"]
    def row_order(kv):
        (case, n), _ = kv
        return order.index(case) if case in order else 99, n

    for (case, n), peers in sorted(bench.rows.items(), key=row_order):
        base = peers.get("ddp fresh")
        cells = [table_cell(peers.get(peer), base, digits=3, width=90) for peer in PEERS]
        lines.append(f"| {case} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "Cases: " + "; ".join(f"**{c}** = {t}" for c, t in TITLES.items()) +
              f"; **allreduce tail** = {bench.tail_cells} fresh (b) cells in a row (median, min–max; p95 below).", ""]
    tail = bench.rows.get(("allreduce tail", 4), {}).get("ddp fresh")
    if isinstance(tail, dict):
        lines += [f"Tail of {tail['n']} fresh 4-rank (b) cells: median {tail['median']:.3f} s, "
                  f"p95 {tail['p95']:.3f} s, max {tail['max']:.3f} s.", ""]
    if bench.first:
        lines += ["Seconds from execute to a rank's first output line (`step 0` / `epoch 0`), median (min–max):", "",
                  "| case | ranks | " + " | ".join(PEERS) + " |", "|---|---|" + "---|" * len(PEERS)]
        for (case, n), peers in sorted(bench.first.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
            lines.append(f"| {case} | {n} | " + " | ".join(
                f"{peers[p]['median']:.3f} ({peers[p]['min']:.3f}–{peers[p]['max']:.3f})" if p in peers else ""
                for p in PEERS) + " |")
        lines.append("")
    if getattr(bench, "first_cell_times", None):
        lines += [first_cell.summary(bench.first_cell_times, 4) + ".", ""]
    lines += ["## Targets (4 ranks)", ""]

    def med(case, n, peer):
        v = bench.rows.get((case, n), {}).get(peer)
        return v["median"] if isinstance(v, dict) else None

    def verdict(ok):
        return "MET" if ok else "MISSED"
    fresh_b, acc_b = med("allreduce", 4, "ddp fresh"), med("allreduce", 4, "accelerate")
    tr_b = med("allreduce", 4, "torchrun")
    if fresh_b and acc_b:
        lines.append(f"- fresh init+all_reduce ≤ 0.5× accelerate: {fresh_b / acc_b:.2f}× → "
                     f"{verdict(fresh_b <= 0.5 * acc_b)}")
    else:
        lines.append("- fresh init+all_reduce vs accelerate: accelerate not measured")
    if fresh_b and tr_b:
        lines.append(f"- fresh init+all_reduce ≥ 20× faster than torchrun: {tr_b / fresh_b:.1f}× → "
                     f"{verdict(tr_b >= 20 * fresh_b)}")
    fresh_d, acc_d = med("ddp", 4, "ddp fresh"), med("ddp", 4, "accelerate")
    if fresh_d and acc_d:
        lines.append(f"- (d) fresh DDP cell ≤ 0.25× accelerate and ≤ 0.5 s: {fresh_d:.3f} s, "
                     f"{fresh_d / acc_d:.2f}× → {verdict(fresh_d <= 0.25 * acc_d and fresh_d <= 0.5)}")
    elif fresh_d:
        lines.append(f"- (d) fresh DDP cell ≤ 0.5 s: {fresh_d:.3f} s → {verdict(fresh_d <= 0.5)}; "
                     "vs accelerate: NOT CHECKED (accelerate not measured)")
    if not isinstance(tail, dict):
        lines.append("- (b) p95 of the fresh-cell tail ≤ 2× its median: NOT CHECKED (tail not measured)")
    else:
        lines.append(f"- (b) p95 of {tail['n']} fresh cells ≤ 2× their median: {tail['p95']:.3f} s vs "
                     f"{tail['median']:.3f} s = {tail['p95'] / tail['median']:.2f}× → "
                     f"{verdict(tail['p95'] <= 2 * tail['median'])}")
    first_d = bench.first.get(("ddp", 4), {}).get("ddp fresh")
    if not first_d:
        lines.append("- first output of a fresh DDP cell ≤ 0.5 s: NOT CHECKED (case ddp not measured)")
    else:
        lines.append(f"- first output (`step 0`) of a fresh DDP cell ≤ 0.5 s after execute: "
                     f"{first_d['median']:.3f} s → {verdict(first_d['median'] <= 0.5)}")
    shown = (getattr(bench, "first_cell_times", None) or {}).get("shown")
    if shown:
        lines.append(f"- the first cell after %load_ext shows its status ≤ 0.3 s after execute: "
                     f"{statistics.median(shown):.2f} s → {verdict(statistics.median(shown) <= 0.3)}")
    else:
        lines.append("- the first cell after %load_ext shows its status ≤ 0.3 s: NOT CHECKED (not measured)")
    pool_a, px_a = med("trivial", 4, "ddp pool"), med("trivial", 4, "ipyparallel")
    if pool_a and px_a:
        lines.append(f"- pool trivial cell ≤ 0.5× ipyparallel %%px: {pool_a:.4f} s vs {px_a:.4f} s = "
                     f"{pool_a / px_a:.2f}× → {verdict(pool_a <= 0.5 * px_a)}")
    else:
        why = ("case trivial not measured" if "trivial" not in getattr(bench, "cases", ["trivial"]) else
               "pool: not available" if not pool_a else "ipyparallel not measured")
        lines.append(f"- pool trivial cell vs ipyparallel: NOT CHECKED ({why})")
    fl, lo = med("prints", 4, "ddp fresh"), med("prints", 4, "local cell")
    if fl and lo:
        lines.append(f"- 4×{PRINTS} lines all delivered (checked) and ≤ 2× a local cell: {fl / lo:.2f}× → "
                     f"{verdict(fl <= 2 * lo)}")
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
    cases = [c for c in ("trivial", "allreduce", "ddp", "dataloader") if any(k[0] == c for k in bench.rows)]
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4.5), squeeze=False)
    axes = axes[0]
    for ax, case in zip(axes, cases, strict=True):
        ns = sorted({n for (c, n) in bench.rows if c == case})
        peers = [p for p in PEERS if any(isinstance(bench.rows[(case, n)].get(p), dict) for n in ns)]
        width = 0.8 / max(1, len(peers))
        for i, peer in enumerate(peers):
            measured = [(j, n) for j, n in enumerate(ns) if isinstance(bench.rows[(case, n)].get(peer), dict)]
            xs = [j + i * width for j, n in measured]
            ys = [bench.rows[(case, n)][peer]["median"] for j, n in measured]
            ax.bar(xs, ys, width, label=peer)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ns))], [f"{n} ranks" for n in ns])
        ax.set_yscale("log")
        ax.set_ylabel("seconds per cell (median, log)")
        ax.set_title(TITLES[case], fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4,8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="ranks 2,4 with 3 repeats")
    p.add_argument("--cases", default=",".join(CASES), help="of " + ",".join(CASES))
    p.add_argument("--tail", type=int, default=TAIL_CELLS, help="fresh (b) cells in the tail run")
    p.add_argument("--out", default=HERE)
    a = p.parse_args()
    ranks = [2, 4] if a.quick else [int(x) for x in a.ranks.split(",")]
    repeats = 3 if a.quick else a.repeats
    cases = [c for c in a.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    bench = Bench(ranks, repeats, cases)
    bench.tail_cells = a.tail
    bench.run()
    print(report(bench, os.path.join(a.out, "results.md"), os.path.join(a.out, "results.png")))


if __name__ == "__main__":
    main()
