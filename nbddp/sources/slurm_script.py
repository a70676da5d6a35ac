"""The Slurm batch job for an exported ``%%ddp`` cell (``--export train.py --slurm``).

Pure text: no processes. The job is the usual ``srun torchrun`` recipe: one task per node, each
task a torchrun agent starting the node's ranks, all meeting at a c10d rendezvous on the job's
first node. torchrun is run as ``$PYTHON -m torch.distributed.run`` (the same program as the
``torchrun`` command) so the job names the interpreter that has torch: the exporting kernel's
own (``sys.executable``) where that path exists on the node (a shared filesystem, as
``--launcher slurm`` assumes), else ``python`` on the node's PATH; ``PYTHON=... sbatch
train.sbatch`` overrides both (sbatch passes the submitter's environment on).
"""
from __future__ import annotations

import os
import re
import shlex
import sys

from nbddp.core import torchrun_cli
from nbddp.core.spec import LaunchSpec

# Our #SBATCH lines and the spellings of the same option, so a raw --sbatch line replaces ours.
_ALIASES = {"nodes": ("-N",), "ntasks-per-node": (), "cpus-per-task": ("-c",), "gpus-per-node": (),
            "time": ("-t",), "job-name": ("-J",), "output": ("-o",), "partition": ("-p",),
            "account": ("-A",)}


def wants_gpus(spec: LaunchSpec) -> bool:
    """A job asks Slurm for GPUs when the cell does: ``--backend nccl`` or ``--gpus``."""
    return spec.backend == "nccl" or spec.gpus is not None


def sbatch_options(spec: LaunchSpec, job_name: str) -> list[str]:
    """The job's ``#SBATCH`` options, ours first, then the raw ``--sbatch`` lines (which win)."""
    ours = [("job-name", job_name), ("nodes", spec.nnodes), ("ntasks-per-node", 1),
            ("cpus-per-task", spec.nproc_per_node)]
    if wants_gpus(spec):
        ours.append(("gpus-per-node", spec.nproc_per_node))
    for name, value in (("time", spec.time_limit), ("partition", spec.partition),
                        ("account", spec.account)):
        if value:
            ours.append((name, value))
    ours.append(("output", "%x-%j.out"))
    given = {_option_name(line) for line in spec.sbatch}
    return [f"--{name}={value}" for name, value in ours if name not in given] + list(spec.sbatch)


def _option_name(line: str) -> str:
    word = re.split(r"[=\s]", line.strip(), maxsplit=1)[0]
    if word.startswith("--"):
        return word[2:]
    for name, shorts in _ALIASES.items():
        if word[:2] in shorts:
            return name
    return word


def interpreter_lines(python: str) -> list[str]:
    """Shell lines that set ``PYTHON``: a given one wins, then ``python`` (the exporting kernel's
    interpreter) where it exists on the node, then ``python`` from the node's PATH."""
    return ["# The interpreter with torch: the exporting notebook kernel's (below) where it exists here",
            "# (a shared filesystem puts it on every node), else `python` from the node's PATH (activate",
            "# your environment above). PYTHON=... sbatch chooses another (sbatch passes your environment on).",
            f"kernel_python={shlex.quote(python)}",
            'if [ -z "${PYTHON:-}" ]; then',
            '  if [ -x "$kernel_python" ]; then PYTHON=$kernel_python; else PYTHON=python; fi',
            "fi"]


def sbatch_text(spec: LaunchSpec, script: str, line: str = "", python: str | None = None) -> str:
    """The whole ``.sbatch`` file for ``script`` (its path relative to where the job is submitted);
    ``python``: the interpreter the job prefers (default: this process's, the exporting kernel's)."""
    name = os.path.splitext(os.path.basename(script))[0] or "nbddp"
    port = spec.master_port
    out = ["#!/bin/bash",
           f"# Exported by nbddp from the cell `%%ddp {line.strip()}`." if line.strip() else
           "# Exported by nbddp from a %%ddp cell.",
           f"# Submit it from the folder of {os.path.basename(script)}: sbatch {name}.sbatch"]
    out += [f"#SBATCH {option}" for option in sbatch_options(spec, name)]
    out += ["", "set -euo pipefail"] + interpreter_lines(python or sys.executable)
    out += ["# torchrun's c10d rendezvous runs on the job's first node; the port is taken from the",
            "# job id so two jobs sharing a node do not collide (set RDZV_PORT to choose it).",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"rdzv_port=${{RDZV_PORT:-{port}}}" if port is not None else
            "rdzv_port=${RDZV_PORT:-$((29500 + SLURM_JOB_ID % 10000))}"]
    if spec.env:
        out += ["", "# the cell's --env values (srun passes the environment to every node)"]
        out += [f"export {key}={shlex.quote(value)}" for key, value in spec.env]
    tail = [shlex.quote(os.path.basename(script))] + [shlex.quote(arg) for arg in spec.script_args]
    out += ["", "# one torchrun per node; it starts the node's ranks with torchrun's environment",
            'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \\',
            f'  "$PYTHON" -m {torchrun_cli.module(spec)} \\',
            "  " + " ".join(torchrun_cli.slurm_options(spec, '"$SLURM_NNODES"', '"$head_node:$rdzv_port"',
                                                       '"$SLURM_JOB_ID"')) + " \\",
            "  " + " ".join(tail), ""]
    return "\n".join(out)
