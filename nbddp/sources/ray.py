"""``%%ddp --launcher ray``: the cell runs on a Ray cluster, one torchrun per node; the torchrun
launcher's source (nbddp/sources/torchrun.py) with a Ray driver (nbddp/raynode/driver.py) as the
agent, as ``--launcher slurm`` has srun. Every rank's environment is torchrun's (the node's, plus
``--env``); the driver writes every node's ``[rankN]:`` lines, so the view, ``_ddp``, causes and
``--timeout`` are torchrun's. The cluster is ``--ray-address``, else ``RAY_ADDRESS``, else a local
Ray for the cell; Ray installed and the cluster reachable are checked before anything starts."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys

from nbddp.core import rayaddress, rayjob, torchrun_cli
from nbddp.core.errors import DDPUsageError
from nbddp.core.launch import Launch
from nbddp.core.rankfiles import RankFiles
from nbddp.core.result import RunResult
from nbddp.kernel.logdirs import write_private
from nbddp.raynode import driver
from nbddp.sources.torchrun import ElasticLaunch

CONNECT_CHECK_S = 5.0
CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` leaves its address (Ray's default temp dir)
INSTALL_HINT = 'pip install "nbddp[ray]"'


class RayLaunch(ElasticLaunch):
    """One launch through a Ray driver + one torchrun per node: ``RayLaunch(launch, address).run()``."""

    interrupted_note = "interrupted: every node's torchrun and all its ranks were stopped"

    def __init__(self, launch: Launch, address: rayaddress.RayAddress):
        # each node's GPUs are Ray's to give (the bundle's, as CUDA_VISIBLE_DEVICES): one per rank with nccl
        super().__init__(launch, device_count=launch.spec.nproc_per_node if launch.spec.backend == "nccl" else 0)
        self.address = address

    def expected_ranks(self) -> list[tuple[int, int, int]]:
        k = self.spec.nproc_per_node
        return [(r, r % k, r // k) for r in range(self.spec.world_size)]

    def _start(self) -> None:
        super()._start()
        if self.address.local:
            self.note("no --ray-address or RAY_ADDRESS: a local Ray is started for this cell and stopped after it")

    def command(self, cell_path: str) -> list[str]:
        """The driver's command; what it does is in its config file (the launch's log folder)."""
        spec, log_dir = self.spec, self.result.log_dir
        copy = RankFiles(log_dir).cell_copy
        config = rayjob.driver_config(
            spec, address=self.address.text, tail=torchrun_cli.rank_entry(log_dir, cell_path, spec.script_args),
            env=self.launch_env(), cwd=self.cwd, files={path: self.source_text for path in {cell_path, copy}},
            dirs=[self.status_dir], nodes_file=os.path.join(log_dir, "ray-nodes.json"),
            local_cpus=os.cpu_count() or 1)
        path = os.path.join(log_dir, "ray-launch.json")
        failed = write_private(path, json.dumps(config))
        if failed is not None:
            raise OSError(failed.errno, f"nbddp: cannot write the Ray launch's config in {log_dir} "
                          f"({failed.strerror}); nothing was started")
        return [sys.executable, "-m", "nbddp.raynode", path]

    def stop_agent(self, sig: int) -> None:
        """SIGINT and SIGTERM to the driver alone (it passes them to every node's torchrun; a
        local Ray it started shares its session and must not get them); SIGKILL to its session."""
        agent = self.agent
        if agent is None or not agent.running():
            return
        if sig == signal.SIGKILL:
            agent.signal_group(sig)
            return
        try:
            os.kill(agent.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _here(self, status: dict) -> bool:
        """Only this machine's ranks can be signalled by pid; the driver reaches the others."""
        return status.get("host", socket.gethostname()) == socket.gethostname()

    def finish(self) -> None:
        super().finish()
        if any(line.startswith(driver.SAYS) for line in self.agent_lines):  # the driver stopped, not torchrun
            for res in self.result.ranks:
                if res.cause.startswith("never started (torchrun ended"):
                    res.cause = "never started (the Ray driver ended before this rank ran)"

    def _agent_failure(self, text: str, rc: int) -> str:
        said = [line.strip() for line in self.agent_lines if line.startswith(driver.SAYS)]
        if said:  # the driver's own reason to stop (no placement, a lost node), not torchrun's
            return f"{said[0][len(driver.SAYS):]} (the Ray driver's log: {self.agent.agent_log})"
        return super()._agent_failure(text, rc)


def check_available(spec, env: dict) -> rayaddress.RayAddress:
    """Ray importable, the address well formed and reachable, a local Ray only for one node:
    a DDPUsageError before anything starts; the address to use."""
    if importlib.util.find_spec("ray") is None:
        raise DDPUsageError(f"%%ddp: --launcher ray needs Ray in the kernel's Python: {INSTALL_HINT}")
    try:
        address = rayaddress.choose(spec.ray_address, env)
    except ValueError as exc:
        raise DDPUsageError(f"%%ddp: {exc}") from None
    if address.local and spec.nnodes > 1:
        raise DDPUsageError(f"%%ddp: --nnodes {spec.nnodes} with --launcher ray needs a Ray cluster of "
                            f"{spec.nnodes} nodes: give its address (--ray-address HOST:PORT, or "
                            f"RAY_ADDRESS); a local Ray is one node")
    host, port = address.host, address.port
    if address.text == "auto":  # the Ray `ray start` last started on this machine, as Ray finds it
        try:
            with open(CURRENT_CLUSTER) as f:
                host, _, port_text = f.read().strip().rpartition(":")
            port = int(port_text)
        except (OSError, ValueError):
            raise DDPUsageError(f"%%ddp: {address.origin} auto: no Ray was started on this machine "
                                f"({CURRENT_CLUSTER} is missing); start one with `ray start --head`, "
                                f"or give the cluster's HOST:PORT") from None
    if host is not None and port is not None:
        try:
            socket.create_connection((host, port), timeout=CONNECT_CHECK_S).close()
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise DDPUsageError(f"%%ddp: the Ray cluster at {address.text} ({address.origin}) cannot be "
                                f"reached: {why}; start one with `ray start --head`, or give another "
                                f"address") from None
    return address


def run(launch: Launch) -> RunResult:
    """Ray's entry in nbddp/api.py's table of sources (``--launcher ray``)."""
    address = check_available(launch.spec, launch.env_base)
    return RayLaunch(launch, address).run()
