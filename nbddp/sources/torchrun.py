"""``%%ddp --launcher torchrun``: the cell runs under torch's own elastic launcher.

The cell is written as a script in the launch's log folder and ``python -m torch.distributed.run``
runs it in its own session; every node of a multi-node job runs the same torchrun. Its ``--tee 3``
``[rankN]:`` lines are read back per rank into the local launcher's events, so views, ``_ddp`` and
errors are the same; each rank runs through nbddp.rank.torchrun_rank, which leaves a status file.
Split as for nbddp's own ranks: the command line nbddp/core/torchrun_cli.py, the agent
nbddp/sources/torchrun_agent.py, the status files nbddp/sources/torchrun_ranks.py."""
from __future__ import annotations

import os
import shlex
import signal
import sys

from nbddp.core import diagnosis, envvars, placement, settings, torchrun_cli
from nbddp.core.cellnames import log_label
from nbddp.core.envvars import legacy_flag
from nbddp.core.launch import Launch
from nbddp.core.rankfiles import RankFiles
from nbddp.core.result import FAILED, KILLED, RankResult, RunResult, launch_result
from nbddp.forkserver import storehost
from nbddp.kernel import cellscript
from nbddp.kernel.logdirs import fresh_subdir, new_log_dir, write_private
from nbddp.sources import ranklogs
from nbddp.sources.supervisor import Source, Supervisor
from nbddp.sources.torchrun_agent import PREFIX_TEMPLATE, PREFIX_VAR, AgentProcess, killpg, launched_by
from nbddp.sources.torchrun_ranks import TorchrunRanks


class ElasticLaunch(Source):
    """One launch through torchrun: ``ElasticLaunch(launch).run()`` → RunResult.

    A process source under nbddp/sources/supervisor.py whose one process is torchrun's agent. Two
    places to vary the agent (``--launcher slurm`` does): ``command(cell_path)`` builds the
    agent's command line, and ``stop_agent(sig)`` is called whenever nbddp must signal the
    agent (interrupt, timeout, escalation, kernel exit, and cleanup of an agent still running).
    """

    interrupted_note = "interrupted: torchrun and all its ranks were stopped"
    script_beside_notebook = True  # the ranks' __file__ in cwd (nbddp/kernel/cellscript.py)

    def __init__(self, launch: Launch, *, device_count: int | None = None):
        self.spec = spec = launch.spec
        self.source_text = launch.source
        self.label = launch.cell_label
        self.theme = launch.traceback_theme
        self.script: str | None = None
        self.sinks = list(launch.sinks)
        self.cwd = os.path.abspath(launch.cwd)
        self.base_env = dict(launch.env_base)
        self.device_count = storehost.device_count() if device_count is None else device_count
        self.placement = placement.plan(spec, self.device_count, self.base_env)  # once per launch
        self.options = self.agent_options()
        self.agent: AgentProcess | None = None
        self.ranks: TorchrunRanks | None = None
        self.stop: tuple[str, str] | None = None  # (reason, why) once nbddp signalled the launch
        self.sent: set[int] = set()

    def _emit(self, *args) -> None:  # self.emit is the one the supervisor passed to start(emit)
        self.emit(*args)

    # ----------------------------------------------------------------- public
    def agent_options(self) -> list[str]:
        return torchrun_cli.options(self.spec)

    def expected_ranks(self) -> list[tuple[int, int, int]]:
        """(rank, local rank, node rank) of the ranks this launch shows before they start:
        this node's, numbered as torchrun will (c10d may renumber)."""
        node, k = self.spec.node_rank or 0, self.spec.nproc_per_node
        return [(node * k + local, local, node) for local in range(k)]

    def command(self, cell_path: str) -> list[str]:
        """The agent's command line (overridable: e.g. ``srun`` in front of it)."""
        return torchrun_cli.agent_command(sys.executable, self.spec, self.result.log_dir, cell_path)

    def stop_agent(self, sig: int) -> None:
        """Signal the agent's session (overridable: e.g. ``scancel`` the job as well)."""
        if self.agent is not None and self.agent.running():
            self.agent.signal_group(sig)

    def run(self) -> RunResult:
        return Supervisor(self, self.spec, self.sinks).run()

    # ---------------------------------------------------------------- Source
    def _start(self) -> None:
        spec = self.spec
        log_dir = new_log_dir(spec.log_dir)
        self.status_dir = fresh_subdir(RankFiles(log_dir).status_dir)  # no earlier launch's pids
        log_copy = RankFiles(log_dir).cell_copy
        failed = write_private(log_copy, self.source_text)  # what every rank runs: whole, or nothing starts
        if failed is not None:
            raise OSError(failed.errno, f"nbddp: cannot write the cell's copy for torchrun in {log_dir} "
                          f"({failed.strerror}); nothing was started")
        if self.script_beside_notebook:
            self.script = cellscript.create(self.cwd, self.source_text)
        self.cell_path = cell_path = self.script or log_copy
        self.cell_label = self.label or log_label(log_copy)
        self.result = launch_result(spec, log_dir, with_ranks=False,
                                    master_port=torchrun_cli.meeting_port(spec), script=cell_path)
        self.ranks = TorchrunRanks(self.result, self.status_dir, spec.nproc_per_node, self._emit, self.note)
        for rank, local, node in self.expected_ranks():
            self.ranks.get(rank, local, node)
        env = envvars.inherited(self.base_env, spec)  # not the hub's token, unless --env gives it
        env.update(self.launch_env())
        cmd = self.command(cell_path)
        write_private(os.path.join(log_dir, "torchrun-command.txt"), shlex.join(cmd) + "\n")  # for the user
        self.emit("launch_started", self.result, spec, self.placement.backend)
        if self.placement.note:
            self.note(self.placement.note)
        self.agent = AgentProcess(log_dir, self._on_output, self.note)
        self.agent.start(cmd, self.cwd, env)

    def launch_env(self) -> dict[str, str]:
        """What this launch adds to the environment torchrun inherits: the placement, ``--env``,
        and what nbddp's rank entry reads (its status folder, the cell's copy, label and colours)."""
        env = dict(self.placement.env)
        env.update(dict(self.spec.env))
        env[PREFIX_VAR] = PREFIX_TEMPLATE
        env[settings.ELASTIC_DIR] = self.status_dir  # read by nbddp/rank/torchrun_rank.py
        env[settings.ELASTIC_CELL_LABEL] = self.cell_label
        if self.theme:
            env[settings.ELASTIC_TB_THEME] = self.theme
        env[settings.ELASTIC_SOURCE] = RankFiles(self.result.log_dir).cell_copy  # what the ranks run, on every start
        flag = legacy_flag(self.spec)
        if flag is not None:
            env[settings.ELASTIC_LEGACY_FLAG] = flag
        return env

    def note(self, text: str) -> None:
        """A note for the user; not the idle warning ("a hung collective?") once a rank of this
        attempt ended badly: torchrun is stopping the others, the launch is ending."""
        if text.startswith(diagnosis.IDLE_WARNING) and self.ranks is not None and self.ranks.ending():
            return
        super().note(text)

    def busy(self) -> bool:
        return self.agent is not None and self.agent.running()

    def poll(self, timeout: float) -> None:
        self.agent.read(timeout)
        self.ranks.scan(self.stop, self.sent)

    def _on_output(self, rank: int, stream: str, payload: bytes) -> None:
        self.ranks.wrote(rank, self.stop, self.sent)
        self.emit("output", rank, stream, payload)

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
                killpg(pid, sig)

    def handling(self) -> list[int]:
        return [r for r in self._rank_pids() if os.path.exists(self.ranks.sigint_path(r))]

    def kill_now(self) -> None:
        """SIGKILL torchrun and every rank it started (each rank has its own session)."""
        self.sent.add(signal.SIGKILL)
        for pid in self._rank_pids().values():
            killpg(pid, signal.SIGKILL)
        self.stop_agent(signal.SIGKILL)

    def stack_targets(self) -> list:
        return [(self.ranks.by_rank[r], pid, self.ranks.stacks_path(r)) for r, pid in self._rank_pids().items()]

    def _here(self, status: dict) -> bool:
        """Can this rank be signalled by pid from here (overridable: Slurm's other nodes not)?"""
        return True

    def _rank_pids(self) -> dict[int, int]:
        """Live ranks that can be reached from here: rank → pid. Only pids nbddp started (their
        environment names this launch's status folder): a pid in a status file is never taken
        on trust, so a planted or stale file cannot make the kernel signal another process."""
        if self.ranks is None:
            return {}
        return {r: s["pid"] for r, s in self.ranks.live().items()
                if self._here(s) and isinstance(s["pid"], int) and s["pid"] > 0
                and launched_by(s["pid"], settings.ELASTIC_DIR, self.status_dir)}

    # --------------------------------------------------------------- closing
    def close(self) -> None:
        agent = self.agent
        if agent is not None:
            if agent.running():
                self.kill_now()
            agent.finish_reading()
        if self.ranks is not None:
            self.ranks.scan(self.stop, self.sent)
        for pid in self._rank_pids().values():  # a rank torchrun could not stop (it ignored SIGTERM)
            killpg(pid, signal.SIGKILL)
        if agent is not None and agent.group_alive():
            self.stop_agent(signal.SIGKILL)
            agent.signal_group(signal.SIGKILL)  # anything torchrun's session left behind
        if agent is not None:
            agent.close_logs()
            ranklogs.trim_copies(os.path.join(self.result.log_dir, "torchrun"), agent.budget)
        cellscript.remove(self.script)  # every rank has ended

    @property
    def agent_lines(self) -> list[str]:
        """What torchrun (or srun) said, not prefixed by a rank."""
        return self.agent.lines if self.agent is not None else []

    # ---------------------------------------------------------------- result
    def finish(self) -> None:
        agent_text = "".join(self.agent_lines)
        rc = self.agent.returncode if self.agent is not None else None
        self.ranks.settle_all(self.stop, self.sent, rc, diagnosis.agent_failures(agent_text),
                              diagnosis.agent_closed(agent_text))
        if self.stop is None and rc not in (0, None) and (
                not self.result.ranks or not any((r.state == FAILED and r.exception) or r.state == KILLED
                                                 for r in self.result.ranks)):
            self.note(self._agent_failure(agent_text, rc))
        if rc not in (0, None) and self.result.ok:
            # every rank of this node ended ok, yet torchrun failed (another node's rank failed):
            # the launch failed, so say so with the agent as the failed party
            self.result.ranks.append(RankResult(rank=-1, local_rank=-1, node_rank=self.spec.node_rank or 0,
                                                state=FAILED, cause=f"torchrun on this node exited with code {rc}"))

    def _agent_failure(self, text: str, rc: int) -> str:
        return diagnosis.agent_failure(text, rc, self.spec, self.agent.agent_log)


def run(launch: Launch) -> RunResult:
    """torchrun's entry in nbddp/api.py's table of sources (``--launcher torchrun``)."""
    return ElasticLaunch(launch).run()
