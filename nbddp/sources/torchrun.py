"""``%%ddp --launcher torchrun``: the cell runs under torch's own elastic launcher.

The cell is written as a script in the launch's log folder and ``python -m torch.distributed.run``
runs it (in its own session, so nothing it starts can outlive the cell). This is how one
notebook joins a real multi-node job: every node runs the same torchrun with the same
``--rdzv-endpoint`` (c10d rendezvous) or ``--master-addr/--master-port`` (static).

torchrun's ``--tee 3`` copies every rank's output to its own with a ``[rankN]:`` prefix; nbddp
reads it back per rank and sends the same events as the local launcher (``launch_started``,
``rank_started``, ``output``, ``note``, ``tick``, ``rank_exited``, ``launch_finished``), so the
display, ``_ddp`` and the errors are the same. Each rank runs through ``nbddp.rank.torchrun_rank``,
which leaves its pid, exception and exit code in a status file.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time

from nbddp.kernel import cellscript
from nbddp.core import diagnosis
from nbddp.core import placement
from nbddp.core.cellnames import log_label
from nbddp.rank.torchrun_rank import LABEL_VAR, LEGACY_VAR, PREFIX_VAR, STATUS_DIR_VAR
from nbddp.core.envvars import legacy_flag
from nbddp.kernel.logdirs import new_log_dir, private
from nbddp.core.result import FAILED, KILLED, RUNNING, TERMINATED, RankResult, RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.sources.supervisor import Source, Supervisor, ended_by_nbddp, settle, stopped_state

DRAIN_LIMIT_S = 3.0
_PREFIX = re.compile(rb"^\[rank(\d+)\]:")
_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_options(spec: LaunchSpec, node_rank: int | None = None) -> list[str]:
    """torchrun's options for ``spec`` (one node's view: ``node_rank`` where it matters)."""
    opts = [f"--nnodes={spec.nnodes}", f"--nproc-per-node={spec.nproc_per_node}"]
    if node_rank is None:
        node_rank = spec.node_rank
    if spec.rdzv_endpoint:
        opts += [f"--rdzv-backend={spec.rdzv_backend}", f"--rdzv-endpoint={spec.rdzv_endpoint}"]
        if spec.rdzv_id:
            opts.append(f"--rdzv-id={spec.rdzv_id}")
        if node_rank is not None:
            opts.append(f"--node-rank={node_rank}")
        if spec.rdzv_timeout:
            opts.append(f"--rdzv-conf=join_timeout={math.ceil(spec.rdzv_timeout)}")
    elif spec.nnodes == 1 and spec.master_port is None:
        opts.append("--standalone")
        if spec.rdzv_timeout:
            opts.append(f"--rdzv-conf=join_timeout={math.ceil(spec.rdzv_timeout)}")
    else:  # static: nbddp/core/spec.py checked the port and the node rank are given
        opts += [f"--master-addr={spec.master_addr}", f"--master-port={spec.master_port}",
                 f"--node-rank={node_rank or 0}"]
        if spec.rdzv_timeout:
            opts.append(f"--rdzv-conf=timeout={math.ceil(spec.rdzv_timeout)}")
    if spec.max_restarts:
        opts.append(f"--max-restarts={spec.max_restarts}")
    return opts


def _agent_preexec() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # the kernel dies → torchrun is told
    except Exception:
        pass


class ElasticLaunch(Source):
    """One launch through torchrun: ``ElasticLaunch(spec, source=...).run()`` → RunResult.

    A process source under nbddp/sources/supervisor.py whose one process is torchrun's agent. Two
    places to vary the agent (``--launcher slurm`` does): ``command(cell_path)`` builds the
    agent's command line, and ``stop_agent(sig)`` is called whenever nbddp must signal the
    agent (interrupt, timeout, escalation, kernel exit, and cleanup of an agent still running).
    """

    interrupted_note = "interrupted: torchrun and all its ranks were stopped"
    script_beside_notebook = True  # the ranks' __file__ in cwd (nbddp/kernel/cellscript.py)

    def __init__(self, spec: LaunchSpec, *, source: str, sinks=(), cwd: str | None = None,
                 base_env: dict | None = None, device_count: int | None = None,
                 cell_label: str | None = None):
        self.spec = spec
        self.source_text = source
        self.label = cell_label
        self.script = None
        self.sinks = list(sinks)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.device_count = placement.cuda_device_count() if device_count is None else device_count
        self.placement = placement.plan(spec, self.device_count, self.base_env)
        self.options = self.agent_options()
        self.proc: subprocess.Popen | None = None
        self.ranks: dict[int, RankResult] = {}
        self.confirmed: set[int] = set()
        self.seen: dict[int, dict] = {}       # rank → its last status file
        self.logs: dict[tuple[int, str], object] = {}
        self.buffers = {"stdout": b"", "stderr": b""}
        self.agent_lines: list[str] = []
        self.stop: tuple[str, str] | None = None  # (reason, why) once nbddp signalled the launch
        self.sent: set[int] = set()
        self._selector = None
        self._streams: dict[int, str] = {}

    # ----------------------------------------------------------------- public
    def agent_options(self) -> list[str]:
        return torchrun_options(self.spec)

    def expected_ranks(self) -> list[tuple[int, int, int]]:
        """(rank, local rank, node rank) of the ranks this launch shows before they start:
        this node's, numbered as torchrun will (c10d may renumber)."""
        node, k = self.spec.node_rank or 0, self.spec.nproc_per_node
        return [(node * k + local, local, node) for local in range(k)]

    def command(self, cell_path: str) -> list[str]:
        """The agent's command line (overridable: e.g. ``srun`` in front of it)."""
        return ([sys.executable, "-m", "torch.distributed.run"] + self.options +
                ["--tee=3", f"--log-dir={os.path.join(self.result.log_dir, 'torchrun')}",
                 "-m", "nbddp.rank.torchrun_rank", cell_path] + list(self.spec.script_args))

    def stop_agent(self, sig: int) -> None:
        """Signal the agent's session (overridable: e.g. ``scancel`` the job as well)."""
        if self.proc is not None and self.proc.poll() is None:
            _killpg(self.proc.pid, sig)

    def run(self) -> RunResult:
        return Supervisor(self, self.spec, self.sinks).run()

    # ---------------------------------------------------------------- Source
    def _start(self) -> None:
        spec = self.spec
        log_dir = new_log_dir(spec.log_dir)
        self.status_dir = os.path.join(log_dir, "status")
        os.makedirs(self.status_dir, mode=0o700, exist_ok=True)
        log_copy = os.path.join(log_dir, "cell.py")
        with open(log_copy, "w", opener=private) as f:
            f.write(self.source_text)
        if self.script_beside_notebook:
            self.script = cellscript.create(self.cwd, self.source_text)
        self.cell_path = cell_path = self.script or log_copy
        self.cell_label = self.label or log_label(log_copy)
        port = None
        if spec.rdzv_endpoint and ":" in spec.rdzv_endpoint:
            port = int(spec.rdzv_endpoint.rsplit(":", 1)[1])
        elif spec.master_port:
            port = spec.master_port
        self.result = RunResult(ranks=[], world_size=spec.world_size, log_dir=log_dir,
                                master_port=port, started_at=time.time(), script=cell_path)
        for rank, local, node in self.expected_ranks():
            self._rank(rank, local, node)
        env = dict(self.base_env)
        env.update(dict(self.placement.env))
        env.update(dict(spec.env))
        env[PREFIX_VAR] = "[rank${rank}]:"
        env[STATUS_DIR_VAR] = self.status_dir
        env[LABEL_VAR] = self.cell_label
        flag = legacy_flag(spec)
        if flag is not None:
            env[LEGACY_VAR] = flag
        cmd = self.command(cell_path)
        with open(os.path.join(log_dir, "torchrun-command.txt"), "w", opener=private) as f:
            f.write(shlex.join(cmd) + "\n")
        self.emit("launch_started", self.result, spec, self.placement.backend)
        if self.placement.note:
            self.note(self.placement.note)
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=_agent_preexec)
        self._selector = selectors.DefaultSelector()
        self._streams = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        for fd, stream in self._streams.items():
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ, stream)

    def busy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll(self, timeout: float) -> None:
        self._read_some(timeout)
        self._scan_status()

    def signal(self, sig: int, reason: str, why: str, spare_handlers: bool = False) -> None:
        """The agent forwards SIGINT to its ranks (torchrun's own shutdown); anything harder
        goes to the agent and to every rank directly (each rank has a session of its own)."""
        if self.stop is None:
            self.stop = (reason, why)
        self.sent.add(sig)
        if sig == signal.SIGINT:
            self.stop_agent(sig)
            return
        handling = set(self.handling()) if spare_handlers else set()
        if not handling:
            self.stop_agent(sig)
        for r, pid in self._rank_pids().items():
            if r not in handling:
                _killpg(pid, sig)

    def handling(self) -> list[int]:
        return [r for r in self._rank_pids()
                if os.path.exists(os.path.join(self.status_dir, f"rank{r}.sigint"))]

    def kill_now(self) -> None:
        """SIGKILL torchrun and every rank it started (each rank has its own session)."""
        self.sent.add(signal.SIGKILL)
        for pid in self._rank_pids().values():
            _killpg(pid, signal.SIGKILL)
        self.stop_agent(signal.SIGKILL)

    def stack_targets(self) -> list:
        return [(self.ranks[r], pid, os.path.join(self.status_dir, f"rank{r}.stacks"))
                for r, pid in self._rank_pids().items()]

    # ----------------------------------------------------------------- ranks
    def _rank(self, rank: int, local_rank: int, node_rank: int, confirmed: bool = False) -> RankResult:
        """The RankResult for ``rank``. Before the rendezvous the global ranks of this node are
        guesses (c10d assigns them); a rank's status file confirms and, if need be, renumbers."""
        res = self.ranks.get(rank)
        if res is None and confirmed:
            guess = next((r for r in self.ranks.values()
                          if r.local_rank == local_rank and r.rank not in self.confirmed), None)
            if guess is not None:
                del self.ranks[guess.rank]
                guess.rank, guess.node_rank = rank, node_rank
                res = self.ranks[rank] = guess
        if res is None:
            res = RankResult(rank=rank, local_rank=local_rank, node_rank=node_rank)
            self.ranks[rank] = res
        if confirmed:
            self.confirmed.add(rank)
        log_dir = self.result.log_dir
        res.stdout_path = os.path.join(log_dir, f"rank{rank}.stdout")
        res.stderr_path = os.path.join(log_dir, f"rank{rank}.stderr")
        self.result.ranks = [self.ranks[r] for r in sorted(self.ranks)]
        return res

    def _log(self, rank: int, stream: str):
        log = self.logs.get((rank, stream))
        if log is None:
            log = self.logs[(rank, stream)] = open(os.path.join(self.result.log_dir, f"rank{rank}.{stream}"), "ab",
                                                     opener=private)
        return log

    def _rank_pids(self) -> dict[int, int]:
        """Live ranks (by their status files): rank → pid."""
        return {r: s["pid"] for r, s in self.seen.items() if "exitcode" not in s and s.get("pid")}

    def _scan_status(self) -> None:
        for path in glob.glob(os.path.join(self.status_dir, "rank*.json")):
            try:
                with open(path) as f:
                    status = json.load(f)
            except (OSError, ValueError):
                continue
            r = status["rank"]
            old = self.seen.get(r)
            if old == status:
                continue
            self.seen[r] = status
            res = self._rank(r, status["local_rank"], status["node_rank"], confirmed=True)
            res.local_rank, res.node_rank = status["local_rank"], status["node_rank"]
            if old is None or old.get("restart") != status.get("restart") or old.get("pid") != status["pid"]:
                if old is not None:
                    self.note(f"rank {r} restarted by torchrun (restart {status.get('restart')})")
                res.pid, res.state, res.started_at = status["pid"], RUNNING, status["started_at"]
                res.exitcode = res.ended_at = None
                res.exception, res.cause = None, ""
                self.emit("rank_started", res)
            if "exitcode" in status and (old is None or "exitcode" not in old):
                res.exception = status.get("exception")
                self._end_rank(res, status["exitcode"], status.get("ended_at"))

    def _end_rank(self, res: RankResult, code: int | None, ended_at: float | None = None) -> None:
        res.exitcode, res.ended_at = code, ended_at or time.time()
        others_failed = any(r.state == FAILED for r in self.ranks.values() if r is not res)
        if (self.stop is None or not ended_by_nbddp(code, res.exception, self.sent)) and others_failed \
                and code in (-signal.SIGTERM, -signal.SIGKILL):
            res.state, res.cause = TERMINATED, "stopped by torchrun after another rank failed"
        else:
            settle(res, self.stop, self.sent)
        self.emit("rank_exited", res)

    # ------------------------------------------------------------------ loop
    def _read_some(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout=timeout):
            try:
                data = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._selector.unregister(key.fd)
                del self._streams[key.fd]
                continue
            self._feed(key.data, data)

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while self._streams and time.monotonic() < deadline:
            self._read_some(0.05)
        for stream, rest in self.buffers.items():
            if rest:
                self._line(stream, rest + b"\n")
            self.buffers[stream] = b""
        self._selector.close()
        self._scan_status()

    def _feed(self, stream: str, data: bytes) -> None:
        data = self.buffers[stream] + data
        *lines, self.buffers[stream] = data.split(b"\n")
        for line in lines:
            self._line(stream, line + b"\n")

    def _line(self, stream: str, line: bytes) -> None:
        match = _PREFIX.match(line)
        if match is None:  # torchrun's own words: kept in agent.log, summarised at the end
            text = line.decode("utf-8", errors="replace")
            self.agent_lines.append(text)
            with open(os.path.join(self.result.log_dir, "agent.log"), "a", opener=private) as f:
                f.write(text)
            return
        rank = int(match.group(1))
        payload = line[match.end():]
        if rank not in self.confirmed:
            self._scan_status()  # its status file names its local rank (written before any output)
        if rank not in self.ranks:
            self._rank(rank, rank % self.spec.nproc_per_node, rank // self.spec.nproc_per_node)
        log = self._log(rank, stream)
        log.write(payload)
        log.flush()
        self.last_output = time.monotonic()
        self.idle_warned = False
        self.emit("output", rank, stream, payload)

    # --------------------------------------------------------------- closing
    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.kill_now()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self._drain()
            for pipe in (self.proc.stdout, self.proc.stderr):
                pipe.close()
        self._scan_status()
        for pid in self._rank_pids().values():  # a rank torchrun could not stop (it ignored SIGTERM)
            _killpg(pid, signal.SIGKILL)
        if _pg_alive(self.proc.pid if self.proc is not None else None):
            self.stop_agent(signal.SIGKILL)
            _killpg(self.proc.pid, signal.SIGKILL)  # anything torchrun's session left behind
        for log in self.logs.values():
            log.close()
        cellscript.remove(self.script)  # every rank has ended

    # ---------------------------------------------------------------- result
    def finish(self) -> None:
        agent_text = "".join(self.agent_lines)
        rc = self.proc.returncode if self.proc is not None else None
        for r, local, code in ((int(a), int(b), int(c)) for a, b, c in _FAILURE.findall(agent_text)):
            res = self.ranks.get(r)
            if res is not None and res.ended_at is None:
                res.local_rank = local
                self._end_rank(res, code)
        first_failed = next((r for r in self.result.ranks if r.state in (FAILED, KILLED)), None)
        for res in self.result.ranks:
            if res.ended_at is not None and res.state != RUNNING:
                continue
            if self.stop is not None:  # ended by nbddp's signals, its status never written
                res.exitcode, res.ended_at = None, time.time()
                stopped_state(res, self.stop)
                self.emit("rank_exited", res)
            elif res.pid is None:
                res.state, res.cause = FAILED, "never started (torchrun ended before this rank ran)"
                res.ended_at = time.time()
                self.emit("rank_exited", res)
            elif first_failed is not None:
                res.state, res.cause = TERMINATED, f"stopped by torchrun after rank {first_failed.rank} failed"
                res.ended_at = time.time()
                self.emit("rank_exited", res)
            elif rc == 0:
                self._end_rank(res, 0)
            else:
                res.state, res.cause = FAILED, f"ended without an exit status (torchrun exited with {rc})"
                res.ended_at = time.time()
                self.emit("rank_exited", res)
        if self.stop is None and rc not in (0, None) and (
                not self.result.ranks or not any(r.state == FAILED and r.exception for r in self.result.ranks)):
            self.note(self._agent_failure(agent_text, rc))
        if rc not in (0, None) and self.result.ok:
            # every rank of this node ended ok, yet torchrun failed (another node's rank failed):
            # the launch failed, so say so with the agent as the failed party
            self.result.ranks.append(RankResult(rank=-1, local_rank=-1, node_rank=self.spec.node_rank or 0,
                                                state=FAILED, cause=f"torchrun on this node exited with code {rc}"))

    def _agent_failure(self, text: str, rc: int) -> str:
        log = os.path.join(self.result.log_dir, "agent.log")
        if "RendezvousTimeoutError" in text or "RendezvousClosedError" in text:
            waited = f" within {self.spec.rdzv_timeout:g} s" if self.spec.rdzv_timeout else ""
            where = self.spec.rdzv_endpoint or f"{self.spec.master_addr}:{self.spec.master_port}"
            return (f"rendezvous timed out: not all {self.spec.nnodes} nodes joined at {where}{waited} "
                    f"(no rank starts until all have). Start torchrun (or %%ddp --launcher torchrun) on "
                    f"the other node{'s' if self.spec.nnodes > 2 else ''} with the same --nnodes, "
                    f"--rdzv-endpoint and --rdzv-id; torchrun's log: {log}")
        errors = [line.strip() for line in text.splitlines()
                  if re.match(r"^[\w.]*(Error|Exception)\b|^torch\.distributed\.\S+(Error|Exception)", line.strip())
                  or line.startswith(("usage:", "torchrun: error", "run.py: error"))]
        last = errors[-1] if errors else (text.strip().splitlines() or [""])[-1]
        return f"torchrun exited with code {rc}: {last[:300]} (torchrun's log: {log})"

def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _pg_alive(pgid: int | None) -> bool:
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_cell(source: str, spec: LaunchSpec, sinks=(), cwd: str | None = None,
             base_env: dict | None = None, cell_label: str | None = None) -> RunResult:
    """torchrun's entry in nbddp/api.py's table of sources (``--launcher torchrun``)."""
    return ElasticLaunch(spec, source=source, sinks=sinks, cwd=cwd, base_env=base_env,
                         cell_label=cell_label).run()
