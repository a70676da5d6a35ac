"""What ``--launcher ray``'s driver (nbddp/raynode/driver.py) is told to do, built in one place:
for a cell (nbddp/sources/ray.py, a JSON file in the launch's log folder) and for the Ray job
``%ddp_export SCRIPT.py --ray`` writes (SCRIPT_ray.py, which ``ray job submit`` runs). Pure."""
from __future__ import annotations

import os
import pprint
import shlex
from typing import Any

from nbddp.core import torchrun_cli
from nbddp.core.spec import LaunchSpec

PREFIX_VAR = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"  # torchrun's --tee line prefix
ENDPOINT = "@ENDPOINT@"  # the word of argv the driver replaces with node 0's HOST:PORT
PLACE_WAIT_S = 120.0  # for the placement group, unless --rdzv-timeout (an autoscaler may add nodes meanwhile)


def wants_gpus(spec: LaunchSpec) -> bool:
    """A node's bundle holds GPUs when the cell asks for them: ``--backend nccl`` or ``--gpus``."""
    return spec.backend == "nccl" or spec.gpus is not None


def driver_config(spec: LaunchSpec, *, address: str | None, tail: list[str], env: dict[str, str], cwd: str,
                  files: dict[str, str] | None = None, dirs: list[str] | None = None,
                  nodes_file: str | None = None, local_cpus: int = 1) -> dict[str, Any]:
    """The driver's config: the cluster (None: a local Ray of ``local_cpus``), one bundle per node
    (the node's ranks' CPUs, and GPUs where asked), torchrun's words after its module (``tail``
    follows its options), what the ranks' environment adds, and the files each node needs."""
    return {
        "address": address, "local_cpus": max(local_cpus, spec.nproc_per_node),
        "nnodes": spec.nnodes, "cpus": spec.nproc_per_node,
        "gpus": spec.nproc_per_node if wants_gpus(spec) else 0, "port": spec.master_port,
        "argv": torchrun_cli.slurm_options(spec, str(spec.nnodes), ENDPOINT, backend="c10d") + list(tail),
        "env": dict(env), "conf_tail": torchrun_cli.conf_tail(spec), "cwd": cwd,
        "files": dict(files or {}), "dirs": list(dirs or []), "nodes_file": nodes_file,
        "place_wait": spec.rdzv_timeout or PLACE_WAIT_S,
    }


def job_script(spec: LaunchSpec, script: str, line: str) -> str:
    """SCRIPT_ray.py: a Ray job (its entrypoint) that runs ``script`` (uploaded with
    ``--working-dir``) as the cell ran: one torchrun per node of a STRICT_SPREAD placement group."""
    name = os.path.basename(script)
    env = {**dict(spec.env), PREFIX_VAR: "[rank${rank}]:"}  # each line of the job's log says its rank
    config = driver_config(spec, address="auto", tail=["--tee=3", name] + list(spec.script_args), env=env, cwd=".")
    config["working_dir"] = "."  # the job's folder on every node (as --working-dir gives it; also run directly)
    return (f"# A Ray job for {name} (written by nbddp's %ddp_export from `%%ddp {line.strip()}`):\n"
            f"# every node of a STRICT_SPREAD placement group ({spec.nnodes} x {spec.nproc_per_node} ranks) runs\n"
            f"# torchrun for {name}, all meeting at a c10d rendezvous on the first node; every rank's\n"
            "# [rankN]: lines are the job's log. nbddp (with Ray) must be installed on the cluster.\n"
            f"#   {submit_command(script)}\n"
            "import sys\n\nfrom nbddp.raynode import driver\n\n"
            f"CONFIG = {pprint.pformat(config, sort_dicts=False, width=100)}\n\n"
            "if __name__ == \"__main__\":\n    sys.exit(driver.run(CONFIG))\n")


def job_path(script: str) -> str:
    return script[:-3] + "_ray.py"


def submit_command(script: str) -> str:
    """The command that submits the exported job, from the script's folder."""
    return f"ray job submit --working-dir . -- python {shlex.quote(os.path.basename(job_path(script)))}"
