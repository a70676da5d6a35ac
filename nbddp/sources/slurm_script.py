"""The Slurm batch job for an exported ``%%ddp`` cell (``--export train.py --slurm``).

Pure text: no processes. The usual ``srun torchrun`` recipe: one task per node, each a torchrun
agent for the node's ranks, meeting at a c10d rendezvous on the job's first node. torchrun runs as
``$PYTHON -m torch.distributed.run`` so the job names an interpreter with torch: the exporting
kernel's (``sys.executable``) where that path exists on the node, else ``python`` on its PATH;
``PYTHON=... sbatch train.sbatch`` overrides both (sbatch passes the environment on)."""
from __future__ import annotations

import os
import re
import shlex
import sys

from nbddp.core import envvars, torchrun_cli
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


# Run as ``python -I -c PORT_CHECK PORT HINT`` on the node that hosts the rendezvous store: prints
# PORT (a free one for 0) if nothing listens there now, else says so in one line and exits 1.
PORT_CHECK = ('import socket, sys\n'
              'port = int(sys.argv[1])\n'
              's = socket.socket()\n'
              's.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n'
              'try:\n'
              '    s.bind(("", port))\n'
              'except OSError as e:\n'
              '    sys.exit(f"nbddp: the rendezvous port {port} on {socket.gethostname()} is taken "\n'
              '             f"({e.strerror}); {sys.argv[2]}")\n'
              'print(s.getsockname()[1])\n')

# Each srun task's shell: the node named in the endpoint hosts the store (is_host=true), the
# others only join it; "$0" is the head node's name, the rest is torchrun's command line.
HOST_SWITCH = ("'if [ \"$SLURMD_NODENAME\" = \"$0\" ]; then is_host=true; else is_host=false; fi\n"
               "  PET_RDZV_CONF=\"is_host=$is_host$RDZV_CONF_MORE\" exec \"$@\"'")

# Each rank runs the script through these lines: its stdout and stderr line-buffered, so each
# line is one write. The ranks of a node share srun's stream; a print written in pieces (always so
# under PYTHONUNBUFFERED, which sbatch passes on; at buffer boundaries otherwise) meets another
# rank's pieces in one line. The rest is ``python SCRIPT ARGS``: argv, sys.path[0],
# __main__ and __file__ as then, the script's frames in tracebacks under its own name.
RUN_BY_LINES = ('import os, sys\n'
                'for stream in (sys.stdout, sys.stderr):\n'
                '    stream.reconfigure(line_buffering=True, write_through=False)\n'
                'sys.argv = sys.argv[1:]\n'
                'sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))\n'
                '__file__ = sys.argv[0]\n'
                'with open(__file__, "rb") as stream:\n'
                '    code = compile(stream.read(), __file__, "exec")\n'
                'del os, sys, stream\n'
                'exec(globals().pop("code"), globals())\n')
LINE_NOTE = ["# Each rank's output reaches the job's as whole lines: the ranks run the script with their",
             "# output line-buffered (run_by_lines: else a print written in pieces, as under",
             "# PYTHONUNBUFFERED, can meet another rank's in one line), and torchrun copies it labelled",
             "# [rankN]: (--tee=3)."]

RANDOM_ID = "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')"


def sbatch_text(spec: LaunchSpec, script: str, line: str = "", python: str | None = None) -> str:
    """The whole ``.sbatch`` file for ``script`` (its path relative to where the job is submitted);
    ``python``: the interpreter the job prefers (default: this process's, the exporting kernel's)."""
    name = os.path.splitext(os.path.basename(script))[0] or "nbddp"
    port = spec.master_port or 0
    out = ["#!/bin/bash",
           f"# Exported by nbddp from the cell `%%ddp {line.strip()}`." if line.strip() else
           "# Exported by nbddp from a %%ddp cell.",
           f"# Submit it from the folder of {os.path.basename(script)}: sbatch {name}.sbatch"]
    out += [f"#SBATCH {option}" for option in sbatch_options(spec, name)]
    out += ["", "set -euo pipefail"] + interpreter_lines(python or sys.executable)
    out += ["# torchrun's c10d rendezvous: the job's first node (this script runs there) hosts its store",
            "# (is_host=true: a taken port stops the job rather than joining someone else's store) at a",
            "# port free there now (RDZV_PORT=... sbatch chooses it), under a random id given in torchrun's",
            "# environment, which `ps` does not show other users. Nothing squeue shows derives either.",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f'rdzv_port=$("$PYTHON" -I -c {shlex.quote(PORT_CHECK)} "${{RDZV_PORT:-{port}}}" \\',
            "  'choose another with RDZV_PORT=... sbatch, or leave RDZV_PORT unset for a free one')",
            f"PET_RDZV_ID={RANDOM_ID}",
            f"RDZV_CONF_MORE={torchrun_cli.conf_tail(spec)}",
            "export PET_RDZV_ID RDZV_CONF_MORE"]
    tokens = [key for key in envvars.HUB_TOKENS if key not in dict(spec.env)]
    out += ["# srun passes this environment to every node; not the JupyterHub token of a hub's terminal",
            f"unset {' '.join(tokens)}"] if tokens else []
    if spec.env:
        out += ["", "# the cell's --env values (srun passes the environment to every node; this file is 0600)"]
        out += [f"export {key}={shlex.quote(value)}" for key, value in spec.env]
    tail = [shlex.quote(os.path.basename(script))] + [shlex.quote(arg) for arg in spec.script_args]
    out += ["", "# one torchrun per node; it starts the node's ranks with torchrun's environment"]
    lines = spec.legacy_launch is None  # torch.distributed.launch puts --local-rank first: run plainly
    if lines:
        out += LINE_NOTE + [f"run_by_lines={shlex.quote(RUN_BY_LINES)}"]
    out += ["export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'"
            "  # the global rank, as the notebook shows it",
            'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1 \\',
            f'  bash -c {HOST_SWITCH} "$head_node" \\',
            f'  "$PYTHON" -m {torchrun_cli.module(spec)} \\',
            "  " + " ".join(torchrun_cli.slurm_options(spec, '"$SLURM_NNODES"', '"$head_node:$rdzv_port"')
                            + ["--tee=3"] + (["--no-python"] if lines else [])) + " \\",
            "  " + " ".join((['"$PYTHON" -c "$run_by_lines"'] if lines else []) + tail), ""]
    return "\n".join(out)
