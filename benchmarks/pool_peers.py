"""nbddp's persistent pool beside the two peers that also keep ranks across cells, in one run:
per-cell time and memory of the pool (``%%ddp`` cells, and ``--all-cells`` cells without a magic),
ipyparallel's ``%%px`` and jupyter-distributed (a notebook's "Processes" = N). All run in this
script's venv (benchmarks/README.md: the peer venv), each in its own kernel; one client times every
cell over ZMQ (tests/support/kernel.py), the peers' cells interleaved; memory is read with one peer
running at a time. Nothing the run started outlives it.

    ../peer-venv/bin/python benchmarks/pool_peers.py [--ranks 2,4] [--repeats 20]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from jupyter_client import BlockingKernelClient  # noqa: E402

from bench import THINK_S, stats, table_cell  # noqa: E402 - benchmarks/bench.py: one way to time a cell
from support.kernel import Kernel  # noqa: E402 - tests/support/kernel.py, on the path just above

TRIVIAL = "pass"
# one all_reduce in the process group made once (an untimed cell); each rank prints the sum, and
# the client checks that every rank's line arrived before the cell counts
ALLREDUCE = "t = torch.ones(1); dist.all_reduce(t); print('SUM', t.item(), 'RANK', dist.get_rank())"
MAKE_GROUP = "import os, torch, torch.distributed as dist\ndist.init_process_group('gloo')"
SHOW_PID = "import os; print('PID', os.getpid())"
CASES = {"trivial": TRIVIAL, "allreduce": ALLREDUCE}
TITLES = {"trivial": "(a) trivial cell (`pass`)", "allreduce": "(b) one `all_reduce` of a 1-element tensor"}
PEERS = ["nbddp pool %%ddp", "nbddp pool --all-cells", "ipyparallel %%px", "jupyter-distributed"]
CELL_TIMEOUT = 120
SETUP_TIMEOUT = 600
MIB = 2**20


class PeerRun:
    """One kind of timed cell: a peer's kernel and how a cell is written for it."""

    def __init__(self, name: str, kernel: Kernel, wrap):
        self.name, self.kernel, self.wrap = name, kernel, wrap

    def cell(self, code: str, n: int, expect: str | None = None):
        """A timed cell: its client seconds; with ``expect`` (a regex whose group is a rank),
        every rank's line must have arrived."""
        def run():
            reply = self.kernel.execute(self.wrap(code), timeout=CELL_TIMEOUT)
            if reply.error or reply.status != "ok":
                raise RuntimeError(f"{self.name}: {(reply.error or {}).get('ename', reply.status)}: "
                                   f"{reply.plain[-300:]}")
            if expect is not None:
                got = sorted({int(r) for r in re.findall(expect, received(reply))})
                if got != list(range(n)):
                    raise RuntimeError(f"{self.name}: {expect!r} from ranks {got}, not all {n}: "
                                       f"{received(reply)[-500:]}")
            return reply.elapsed
        return run

    def rank_pids(self, n: int) -> list[int]:
        reply = self.kernel.execute(self.wrap(SHOW_PID), timeout=CELL_TIMEOUT)
        pids = sorted({int(m) for m in re.findall(r"PID (\d+)", received(reply))})
        if len(pids) != n:
            raise RuntimeError(f"{self.name}: {len(pids)} rank pids, not {n}: {reply.plain[-500:]}")
        return pids


def received(reply) -> str:
    """All the text a cell sent: its streams and the plain text of its displays (ipyparallel's
    ``[stdout:N]`` blocks; jupyter-distributed's ``[Rank N — ok]`` sections)."""
    shown = [o.get("data", {}).get("text/plain", "") for o in reply.outputs]
    return reply.plain + "\n" + "\n".join(t if isinstance(t, str) else "".join(t) for t in shown)


# ------------------------------------------------------------------ processes and memory
SEEN: dict[int, float] = {}  # every process a peer started: pid → create_time (cleanup checks)


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        try:
            SEEN.setdefault(p.pid, p.create_time())
        except psutil.Error:
            pass
    return procs


def pss(procs) -> tuple[float, int]:
    """Summed PSS in MiB, and how many of the processes were read."""
    total, count = 0, 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
            count += 1
        except psutil.Error:
            pass
    return total / MIB, count


KINDS = [("ipyparallel.engine.nanny", "engine nanny"), ("ipyparallel.engine", "engine"),
         ("ipyparallel.controller", "ipcontroller"), ("jupyter_distributed.kernel", "proxy kernel"),
         ("jupyter_server", "jupyter_server"), ("forkserver", "forkserver"), ("resource_tracker", "resource tracker"),
         ("janitor", "janitor"), ("ipykernel", "kernel")]  # (part of the command line, what it is)


def names(procs) -> str:
    seen: dict[str, int] = {}
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        name = p.name()
        kind = name if name.startswith("nbddp-") else next((label for part, label in KINDS if part in cmd), name)
        seen[kind] = seen.get(kind, 0) + 1
    return ", ".join(f"{k} ×{v}" if v > 1 else k for k, v in seen.items())


def memory(root_pid: int, rank_pids: list[int], server_pid: int | None = None) -> dict:
    """PSS of the ranks and of the peer's other processes (the kernel and what it started;
    the Jupyter server, where it is the peer's, apart)."""
    time.sleep(2.0)  # idle
    procs = [p for p in tree(root_pid) if p.pid != server_pid]
    ranks = [p for p in procs if p.pid in rank_pids]
    rest = [p for p in procs if p.pid not in rank_pids]
    r_mib, r_n = pss(ranks)
    o_mib, o_n = pss(rest)
    out = {"ranks": r_mib, "ranks_n": r_n, "rest": o_mib, "rest_n": o_n, "rest_what": names(rest)}
    if server_pid is not None:
        out["server"], _ = pss([psutil.Process(server_pid)])
    return out


def leftovers() -> list[str]:
    """Processes this run started that still run, killed (after 10 s for them to end)."""
    deadline = time.monotonic() + 10
    alive: list[psutil.Process] = []
    while True:
        alive = []
        for pid, created in SEEN.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    left = []
    for p in alive:
        try:
            left.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
            p.kill()
        except psutil.Error:
            pass
    return left


# ------------------------------------------------------------------ the run
class Peer:
    """One peer at N ranks: ``start`` makes its ranks and their process group and gives its kinds
    of timed cell, ``root`` is the process all of its own run under, ``stop`` ends them all."""

    name = ""
    server_pid: int | None = None

    def start(self, n: int) -> list[PeerRun]:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def root(self) -> int:
        raise NotImplementedError


class KernelPeer(Peer):
    """A peer whose ranks all run under one kernel ``k``; ``STOP`` is the cell that ends them."""

    STOP = ""
    k: Kernel | None = None

    def root(self):
        return self.k.pid

    def stop(self):
        if self.k is None:
            return
        tree(self.k.pid)
        try:
            self.k.execute(self.STOP, timeout=120)
        finally:
            self.k.shutdown()
            self.k = None


class NbddpPool(KernelPeer):
    name = "nbddp pool"
    STOP = "%ddp_pool stop"

    def start(self, n):
        self.k = k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-peers-"))
        tree(k.pid)
        k.ok("%load_ext nbddp")
        k.ok(f"%ddp_pool start -n {n} --output text", timeout=SETUP_TIMEOUT)
        k.ok(f"%%ddp\n{MAKE_GROUP}", timeout=SETUP_TIMEOUT)
        # all-cells on: a cell without a magic runs on the pool; a %%ddp cell runs there as before
        k.ok("%ddp_pool all-cells on")
        tree(k.pid)
        return [PeerRun("nbddp pool %%ddp", k, lambda code: f"%%ddp\n{code}"),
                PeerRun("nbddp pool --all-cells", k, lambda code: code)]


class Ipyparallel(KernelPeer):
    name = "ipyparallel"
    STOP = "_cluster is not None and _cluster.stop_cluster_sync()"

    def start(self, n):
        self.k = k = Kernel(cwd=tempfile.mkdtemp(prefix="nbddp-peers-ipp-"))
        tree(k.pid)
        k.ok("_cluster = None")
        k.ok(textwrap.dedent(f"""\
            import ipyparallel as ipp, socket
            _cluster = ipp.Cluster(n={n}, ip="127.0.0.1", log_level=40)
            _rc = _cluster.start_and_connect_sync(activate=True)
            _rc.wait_for_engines({n}, timeout=300)
            with socket.socket() as _s:
                _s.bind(("127.0.0.1", 0)); _port = _s.getsockname()[1]
            for _i, _e in enumerate(_rc):
                _e.apply_sync(lambda i, p, w: __import__("os").environ.update(RANK=str(i),
                    WORLD_SIZE=str(w), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(p)), _i, _port, {n})"""),
             timeout=SETUP_TIMEOUT)
        k.ok(f"%%px\n{MAKE_GROUP}", timeout=SETUP_TIMEOUT)
        tree(k.pid)
        return [PeerRun("ipyparallel %%px", k, lambda code: f"%%px\n{code}")]


class JupyterDistributed(Peer):
    name = "jupyter-distributed"

    def start(self, n):
        self.server = server = JupyterServer()
        server.start()
        self.server_pid = server.proc.pid
        kernel_id = server.post("/api/kernels", {"name": "python3"})["id"]
        # what its "Processes" field does: the extension restarts the kernel as its proxy
        # kernel with N rank kernels behind it (jupyter_distributed/server_extension.py)
        model = server.post(f"/jupyter-distributed/kernels/{kernel_id}", {"action": "set", "world_size": n})
        if model.get("world_size") != n or not model.get("proxied"):
            raise RuntimeError(f"jupyter-distributed did not take world_size {n}: {model}")
        self.k = k = server.attach(kernel_id)
        k.ok(MAKE_GROUP, timeout=SETUP_TIMEOUT)
        tree(server.proc.pid)
        return [PeerRun("jupyter-distributed", k, lambda code: code)]

    def root(self):
        return self.server.proc.pid

    def stop(self):
        if getattr(self, "server", None) is None:
            return
        try:
            if getattr(self, "k", None) is not None:
                self.k.kc.stop_channels()
        finally:
            self.server.stop()
            self.server = self.k = None


class PeerBench:
    def __init__(self, ranks: list[int], repeats: int):
        self.ranks, self.repeats = ranks, repeats
        self.rows: dict[tuple[str, int], dict[str, object]] = {}
        self.mem: dict[str, object] = {}
        self.loads: list[tuple[str, float, float]] = []  # each phase's start: 1-minute load, GiB available

    def put(self, case: str, n: int, peer: str, value) -> None:
        self.rows.setdefault((case, n), {})[peer] = value
        shown = f"{value['median']:.4f} s ({value['min']:.4f}–{value['max']:.4f})" if isinstance(value, dict) else value
        print(f"  {case:>9} n={n} {peer:>24}: {shown}", flush=True)

    def note(self, phase: str) -> None:
        self.loads.append((phase, os.getloadavg()[0], psutil.virtual_memory().available / 2**30))

    def fail(self, n: int, peer: str, exc: BaseException) -> None:
        for case in CASES:
            self.rows.setdefault((case, n), {}).setdefault(peer, f"failed: {type(exc).__name__}: {str(exc)[:150]}")
        print(f"  {peer} n={n} failed: {type(exc).__name__}: {exc}", flush=True)

    def interleaved(self, n: int, runs: list[PeerRun]) -> None:
        """Each case's cells in rounds, one cell of every peer a round (the order turning each
        round), so that a change of the machine's load falls on every peer alike."""
        for case, code in CASES.items():
            expect = rf"SUM {float(n)} RANK (\d+)" if case == "allreduce" else None
            cells = {run.name: run.cell(code, n, expect) for run in runs}
            times: dict[str, list[float]] = {name: [] for name in cells}
            failed: dict[str, str] = {}
            names = list(cells)
            for i in range(1 + self.repeats):  # round 0 is the warm-up
                for name in names[i % len(names):] + names[:i % len(names)]:
                    if name in failed:
                        continue
                    time.sleep(THINK_S)
                    try:
                        t = cells[name]()
                    except (RuntimeError, TimeoutError) as exc:
                        failed[name] = f"failed: {' '.join(str(exc).split())[:150]}"
                        continue
                    if i:
                        times[name].append(t)
            for name in names:
                self.put(case, n, name, failed.get(name) or stats(times[name]))

    def timing(self, n: int) -> None:
        peers = [NbddpPool(), Ipyparallel(), JupyterDistributed()]
        runs: list[PeerRun] = []
        try:
            for peer in peers:
                try:
                    runs += peer.start(n)
                except Exception as exc:  # one broken peer must not hide the others
                    for name in PEERS:
                        if name.startswith(peer.name):
                            self.fail(n, name, exc)
            self.note(f"timing n={n}")
            self.interleaved(n, runs)
        finally:
            for peer in peers:
                try:
                    peer.stop()
                except Exception as exc:
                    print(f"  stopping {peer.name} failed: {type(exc).__name__}: {exc}", flush=True)

    def memory(self, n: int = 4) -> None:
        """Each peer alone (no other peer's processes share its pages), its group made, idle."""
        for peer in (NbddpPool(), Ipyparallel(), JupyterDistributed()):
            try:
                runs = peer.start(n)
                self.note(f"memory {peer.name}")
                self.mem[peer.name] = memory(peer.root(), runs[0].rank_pids(n), peer.server_pid)
            except Exception as exc:
                self.mem[peer.name] = f"failed: {type(exc).__name__}: {str(exc)[:150]}"
            finally:
                peer.stop()
            print(f"  memory {peer.name}: {self.mem[peer.name]}", flush=True)

    def run(self) -> None:
        for n in self.ranks:
            print(f"ranks = {n}", flush=True)
            self.timing(n)
        if 4 in self.ranks:
            self.memory(4)


class Attached(Kernel):
    """A kernel another process started (the Jupyter server), reached through its connection file."""

    def __init__(self, connection_file: str):  # no super().__init__: nothing to start
        self.kc = BlockingKernelClient(connection_file=connection_file)
        self.kc.load_connection_file()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)


class JupyterServer:
    """jupyter_server (with the jupyter-distributed extension this venv enables) on a free local
    port, a token of its own and a runtime folder of its own (where its kernels' connection files are)."""

    def __init__(self):
        self.token = secrets.token_hex(16)
        self.runtime = tempfile.mkdtemp(prefix="nbddp-peers-rt-")
        self.root = tempfile.mkdtemp(prefix="nbddp-peers-jd-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": self.runtime}
        self.log = open(os.path.join(self.runtime, "server.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", "--ServerApp.allow_root=True",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        tree(self.proc.pid)
        deadline = time.monotonic() + 120
        while True:
            try:
                health = self.get("/jupyter-distributed/health")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter_server did not start: {self.tail()}") from None
                time.sleep(0.5)
        if not health.get("ok"):
            raise RuntimeError(f"jupyter-distributed's server extension is not loaded: {health}")

    def tail(self) -> str:
        with open(os.path.join(self.runtime, "server.log")) as f:
            return f.read()[-1500:]

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = SETUP_TIMEOUT) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
        return json.loads(text) if text else {}

    def get(self, path: str) -> dict:
        return self.request("GET", path, timeout=10)

    def post(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body)

    def attach(self, kernel_id: str) -> Attached:
        return Attached(os.path.join(self.runtime, f"kernel-{kernel_id}.json"))

    def stop(self) -> None:
        if self.proc is None:
            return
        tree(self.proc.pid)
        try:
            for kernel in self.get("/api/kernels"):
                self.request("DELETE", f"/api/kernels/{kernel['id']}", timeout=60)
            self.post("/api/shutdown", {})
        except Exception as exc:  # then the signal below ends it
            print(f"  (jupyter_server's own shutdown failed: {type(exc).__name__}: {exc})", flush=True)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.runtime, ignore_errors=True)


# ------------------------------------------------------------------ report
def versions() -> str:
    def v(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return (f"Python {platform.python_version()}, torch {v('torch')}, nbddp {v('nbddp')} ({commit or '?'}), "
            f"ipyparallel {v('ipyparallel')}, jupyter-distributed {v('jupyter-distributed')}, "
            f"jupyter_server {v('jupyter_server')}, ipykernel {v('ipykernel')}")


def report(bench: PeerBench, load_start, load_end, started: datetime.datetime) -> str:
    base_peer = PEERS[0]
    lines = [f"# nbddp pool beside ipyparallel and jupyter-distributed — {started:%Y-%m-%d %H:%M} UTC", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; load average "
             f"{'/'.join(f'{x:.2f}' for x in load_start)} at the start, "
             f"{'/'.join(f'{x:.2f}' for x in load_end)} at the end", versions(), "",
             f"Seconds per cell at the client (execute → idle, every rank's output received), median "
             f"(min–max) of {bench.repeats} after a warm-up, {THINK_S} s between cells, the peers' cells "
             f"interleaved; [ratio to {base_peer}].", "",
             "| case | ranks | " + " | ".join(PEERS) + " |", "|---|---|" + "---|" * len(PEERS)]
    for (case, n), peers in sorted(bench.rows.items(), key=lambda kv: (list(CASES).index(kv[0][0]), kv[0][1])):
        base = peers.get(base_peer)
        cells = [table_cell(peers.get(peer), base, digits=4, width=100) for peer in PEERS]
        lines.append(f"| {TITLES[case]} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "As each phase started, the 1-minute load average and the memory available: "
              + ", ".join(f"{what} {load:.1f}, {free:.1f} GiB" for what, load, free in bench.loads) + "."]
    lines += ["", "Memory, 4 idle ranks after the process group was made: PSS in MiB "
              "(psutil `memory_full_info().pss`), one peer running at a time.", "",
              "| peer | 4 ranks | its other processes | which | total | [ratio to nbddp pool] |",
              "|---|---|---|---|---|---|"]
    base_mem = bench.mem.get("nbddp pool")
    for peer in ("nbddp pool", "ipyparallel", "jupyter-distributed"):
        m = bench.mem.get(peer)
        if not isinstance(m, dict):
            lines.append(f"| {peer} | not measured | | | | |")
            continue
        total = m["ranks"] + m["rest"]
        ratio = (f"{total / (base_mem['ranks'] + base_mem['rest']):.2f}×" if isinstance(base_mem, dict) else "")
        lines.append(f"| {peer} | {m['ranks']:.0f} ({m['ranks_n']} processes) | {m['rest']:.0f} "
                     f"({m['rest_n']} processes) | {m['rest_what']} | {total:.0f} | {ratio} |")
    jd = bench.mem.get("jupyter-distributed")
    if isinstance(jd, dict) and "server" in jd:
        lines += ["", f"jupyter-distributed also needs its server extension in the Jupyter server: that "
                  f"server's PSS was {jd['server']:.0f} MiB (not in the totals: every notebook has a server)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start}", flush=True)
    bench = PeerBench([int(x) for x in a.ranks.split(",")], a.repeats)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the cleanup below too
    try:
        bench.run()
    finally:
        left = leftovers()
        if left:
            print("left running after the run, killed: " + "; ".join(left), flush=True)
    print(report(bench, load_start, os.getloadavg(), started))


if __name__ == "__main__":
    main()
