"""``%%ddp --launcher slurm``: the cell runs on a Slurm allocation, one torchrun per node.
A thin variant of nbddp/sources/torchrun.py: the agent command is ``srun ... bash slurm-node.sh``,
each task a ``python -m torch.distributed.run`` for its node's ranks, meeting at a c10d rendezvous
on the step's first node under a random id and port (nothing ``squeue`` shows derives either);
srun gets the kernel's environment without the JupyterHub token (nbddp/core/envvars.py). Inside an
allocation (``SLURM_JOB_ID``) the cell is a job step, else a new job; an interrupt is ``scancel
--signal=INT``, anything harder ``scancel``s and waits until Slurm lists it no more. The cell, its
log folder and the kernel's Python must be at the same paths on every node (a shared filesystem)."""
from __future__ import annotations

import os
import pwd
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from nbddp.core import diagnosis, envvars, torchrun_cli
from nbddp.core.errors import DDPUsageError
from nbddp.core.launch import Launch
from nbddp.core.result import RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.kernel.logdirs import private
from nbddp.sources.slurm_script import PORT_CHECK, wants_gpus
from nbddp.sources.torchrun import ElasticLaunch

CANCEL_WAIT_S = 15.0
# The launch's rendezvous port, where the cell names none (--master-port): random, below Linux's
# ephemeral range (32768-60999) so that no outgoing connection holds it.
PORT_RANGE = (20000, 32768)
NODE_SCRIPT = """#!/bin/bash
# One Slurm task per node (written by nbddp): torchrun starts this node's ranks; all nodes meet
# at a c10d rendezvous on the step's first node, which hosts its store (is_host=true: a taken port
# fails, rather than joining someone else's store). Port and id are this launch's own, random
# (nothing squeue shows derives them); the id goes in torchrun's environment, not on its command
# line, which `ps` shows every user.
set -eu
echo "$SLURM_JOB_ID $SLURM_STEP_ID" > {step_file}
head_node=$(scontrol show hostnames "${{SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}}" | head -n 1)
rdzv_port={port}
export PET_RDZV_ID={rdzv_id}
if [ "$SLURMD_NODENAME" = "$head_node" ]; then
  {python} -I -c {port_check} "$rdzv_port" {hint} > /dev/null
  export PET_RDZV_CONF={conf_host}
else
  export PET_RDZV_CONF={conf_join}
fi
exec {python} -m {module} {options} \\
  "$@"
"""
NODE_SCRIPT_SAYS = "nbddp: "  # how PORT_CHECK's line starts
PORT_HINT = "choose another with --master-port PORT, or leave it out for a random one"


class SlurmLaunch(ElasticLaunch):
    """One launch through ``srun`` + torchrun: ``SlurmLaunch(launch).run()`` → RunResult.

    The torchrun agent source (nbddp/sources/torchrun.py) under the same supervisor, with srun as the
    agent: it varies the command, how the agent is stopped (Slurm signals and cancels the
    remote ranks), which ranks can be reached by pid, and srun's own errors as the cause."""

    interrupted_note = "interrupted: the Slurm step, its torchrun and all its ranks were stopped"
    script_beside_notebook = False  # every node reads the cell from .nbddp-slurm/ (or --log-dir)

    def __init__(self, launch: Launch, *, device_count: int | None = None):
        spec, cwd = launch.spec, os.path.abspath(launch.cwd)
        if not spec.log_dir:  # every node reads the cell and writes its status here: not /tmp
            root = os.path.join(cwd, ".nbddp-slurm")
            os.makedirs(root, exist_ok=True)
            spec = replace(spec, log_dir=tempfile.mkdtemp(prefix="launch-", dir=root))
        # tracebacks name the cell by its copy in the log folder
        super().__init__(replace(launch, spec=spec, cwd=cwd, cell_label=None),
                         device_count=0 if device_count is None else device_count)
        self.base_env = envvars.inherited(self.base_env, spec)  # srun copies it to every node
        self.allocation = self.base_env.get("SLURM_JOB_ID")
        self.job_name = f"nbddp-{os.path.basename(spec.log_dir)}"
        self.cancelled = False

    def agent_options(self) -> list[str]:
        """torchrun's options in the node script (the step's node count and first node there)."""
        return torchrun_cli.slurm_options(self.spec, '"$SLURM_STEP_NUM_NODES"', '"$head_node:$rdzv_port"',
                                          backend="c10d")

    def expected_ranks(self) -> list[tuple[int, int, int]]:
        k = self.spec.nproc_per_node
        return [(r, r % k, r // k) for r in range(self.spec.world_size)]

    def command(self, cell_path: str) -> list[str]:
        log_dir = self.result.log_dir
        self.step_file = os.path.join(log_dir, "slurm-step")
        node_script = os.path.join(log_dir, "slurm-node.sh")
        with open(node_script, "w", opener=private) as f:
            f.write(node_script_text(self.spec, self.step_file, sys.executable, self.options))
        spec = self.spec
        srun = ["srun", f"--nodes={spec.nnodes}", f"--ntasks={spec.nnodes}", "--ntasks-per-node=1",
                f"--cpus-per-task={spec.nproc_per_node}", "--kill-on-bad-exit=1", f"--job-name={self.job_name}"]
        if wants_gpus(spec):
            srun.append(f"--gpus-per-node={spec.nproc_per_node}")
        for flag, value in (("--partition", spec.partition), ("--account", spec.account),
                            ("--time", spec.time_limit)):
            if value:
                srun.append(f"{flag}={value}")
        return srun + ["bash", node_script] + torchrun_cli.rank_entry(log_dir, cell_path, spec.script_args)

    def stop_agent(self, sig: int) -> None:
        """srun and Slurm stand between the kernel and the ranks. SIGINT goes to the step's
        tasks through Slurm (as Ctrl-C in a terminal: torchrun's own shutdown follows); anything
        harder also goes to srun and cancels the step or job, queued ones included. When to send
        which signal is the supervisor's (nbddp/sources/supervisor.py)."""
        if sig == signal.SIGINT and not self.cancelled:
            job, step = self._step()
            if step is not None:  # running: every node's torchrun and ranks get the interrupt
                _run(["scancel", "--signal=INT", f"{job}.{step}"])
                return
            # still queued or starting: nothing runs a handler yet, so cancel outright
        super().stop_agent(sig)
        self.cancel()

    def close(self) -> None:
        super().close()
        if self.cancelled:
            self._wait_gone()

    # ------------------------------------------------- ranks on other nodes
    def _here(self, status: dict) -> bool:
        """Only this machine's ranks can be signalled (or asked for stacks) by pid; Slurm
        reaches the others."""
        return status.get("host", socket.gethostname()) == socket.gethostname()

    # -------------------------------------------------------------- result
    def finish(self) -> None:
        super().finish()
        if diagnosis.srun_errors(self.agent_lines):  # srun, not torchrun, is the agent the kernel watched
            for res in self.result.ranks:
                if res.cause.startswith("never started (torchrun ended"):
                    res.cause = "never started (srun ended before this rank ran)"

    def _agent_failure(self, text: str, rc: int) -> str:
        said = [line.strip() for line in self.agent_lines if line.startswith(NODE_SCRIPT_SAYS)]
        if said:  # the node script's own reason to stop (a taken rendezvous port), not srun's echo of it
            return f"{said[0][len(NODE_SCRIPT_SAYS):]} (srun's log: {self.agent.agent_log})"
        errors = diagnosis.srun_errors(self.agent_lines)
        if not errors:
            return super()._agent_failure(text, rc)
        return diagnosis.srun_failure(errors, rc, self.agent.agent_log)

    # ------------------------------------------------------------ cancelling
    def cancel(self) -> None:
        """scancel this cell's step (inside an allocation) or job, once."""
        if self.cancelled or self.agent is None or self.agent.proc is None:
            return
        self.cancelled = True
        job, step = self._step()
        if self.allocation:
            if step is None:
                return  # srun's end withdraws a step that never started
            target = [f"{job}.{step}"]
        else:
            target = [job] if job else [f"--name={self.job_name}", f"--user={_user()}"]
        _run(["scancel"] + target)

    def _step(self) -> tuple[str | None, str | None]:
        try:
            with open(self.step_file) as f:
                job, step = f.read().split()
            return job, step
        except (OSError, ValueError, AttributeError):
            return None, None

    def _wait_gone(self) -> None:
        """Until squeue lists the job (or step) no more: nothing of the cell still holds nodes."""
        deadline = time.monotonic() + CANCEL_WAIT_S
        job, step = self._step()
        while time.monotonic() < deadline:
            if self.allocation:
                out = _run(["squeue", "-h", "-s", "-j", self.allocation, "-o", "%i"]) if step else ""
                left = f"{job}.{step}" in (out or "").split()
            else:
                left = bool(_run(["squeue", "-h", "-n", self.job_name, "-u", _user(), "-o", "%i"]))
            if not left:
                return
            time.sleep(0.2)
        self.note(f"Slurm still lists {self.job_name} {CANCEL_WAIT_S:g} s after scancel")


def node_script_text(spec: LaunchSpec, step_file: str, python: str, options: list[str]) -> str:
    """The per-node script of one launch, with a fresh random rendezvous id and (unless the cell
    names one with --master-port) port."""
    port = spec.master_port or PORT_RANGE[0] + secrets.randbelow(PORT_RANGE[1] - PORT_RANGE[0])
    return NODE_SCRIPT.format(step_file=shlex.quote(step_file), python=shlex.quote(python),
                              module=torchrun_cli.RUN_MODULE, options=" ".join(options), port=port,
                              rdzv_id=secrets.token_hex(16), port_check=shlex.quote(PORT_CHECK),
                              hint=shlex.quote(PORT_HINT),
                              conf_host=torchrun_cli.slurm_rdzv_conf(spec, "true"),
                              conf_join=torchrun_cli.slurm_rdzv_conf(spec, "false"))


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def check_available(env: dict | None = None) -> None:
    """A clear DDPUsageError where Slurm's commands are missing (not a FileNotFoundError)."""
    import shutil

    if shutil.which("srun", path=(env or os.environ).get("PATH")) is None:
        raise DDPUsageError("%%ddp: --launcher slurm needs Slurm's srun on this machine's PATH "
                         "(run the notebook on a cluster's login node, or inside salloc)")


def run(launch: Launch) -> RunResult:
    """Slurm's entry in nbddp/api.py's table of sources (``--launcher slurm``)."""
    check_available(launch.env_base)
    return SlurmLaunch(launch).run()

