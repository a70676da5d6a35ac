"""The ``%%ddp`` line: its argparse parser (every option, its help and its converter) and
``parse_line``, which turns a line into a checked LaunchSpec through the same rules as the
Python API's keywords (nbddp/core/launchrules.py ``make_spec``). Pure."""
from __future__ import annotations

import argparse
import functools
import re
import shlex
from typing import NoReturn

from nbddp.core import optionvalues as values
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import make_spec
from nbddp.core.spec import BACKENDS, LAUNCHERS, OUTPUTS, SAME_LINES, START_METHODS, LaunchSpec


class _Parser(argparse.ArgumentParser):
    """argparse that reports problems as DDPUsageError instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:  # argparse API
        # "argument -n/--world-size/--np: -n must be…" reads better without the alias list
        message = re.sub(r"^argument [^:]+: (?=-|port|not a|[A-Za-z-]+ (must|takes))", "", message)
        if len(message) > 300:  # argparse repeats what it did not recognize: a hostile line can be long
            message = message[:297] + "..."
        raise DDPUsageError(f"%%ddp: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise DDPUsageError(f"%%ddp: {message.strip()}")
        raise _HelpShown()


class _HelpShown(Exception):
    """Raised after ``-h`` printed the help text: nothing should run."""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%ddp", add_help=True, allow_abbrev=False,
                description="Run the cell as a torchrun-style job of ranked worker processes. "
                            "Arguments after -- become the workers' sys.argv[1:].")
    p.add_argument("-n", "--world-size", "--np", dest="n", type=values.positive_int("-n"), default=None,
                   help="total number of ranks (default: nproc-per-node x nnodes, 1 rank)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                   type=values.positive_int("--nproc-per-node"), default=None, help="ranks per (simulated) node")
    p.add_argument("--nnodes", type=values.positive_int("--nnodes"), default=1,
                   help="number of nodes; with the local launcher they are simulated on this machine")
    p.add_argument("--max-ranks", dest="max_ranks", type=values.positive_int("--max-ranks"), default=None,
                   metavar="N", help="allow up to N ranks on this machine (with --launcher slurm: in the "
                                     "job) in place of the bound nbddp sets from its cores, memory and process "
                                     "and descriptor limits, so that a typo such as -n 4000 is refused before "
                                     "anything starts")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=values.nonneg_int("--node-rank"), default=None,
                   help="this machine's node rank (torchrun launcher only)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="localhost",
                   help="address of the rendezvous host (node 0), default localhost")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=values.port, default=None,
                   help="rendezvous port (default: a free port per launch)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="backend hint, read in a rank with nbddp.backend() (auto: nccl with CUDA, else gloo)")
    p.add_argument("--timeout", type=values.seconds("--timeout"), default=None,
                   help="seconds before a still-running launch is stopped and its stacks shown")
    p.add_argument("--idle-warning", dest="idle_warning", type=values.seconds_or_off("--idle-warning"),
                   default=30.0, help="warn when no rank printed anything for this many seconds (0: never)")
    p.add_argument("--exit-grace", dest="exit_grace", type=values.seconds("--exit-grace"), default=300.0,
                   metavar="SECONDS", help="seconds a rank whose cell has finished may take to exit (atexit "
                                           "handlers, non-daemon threads such as a final checkpoint) before nbddp "
                                           "kills it and reports it killed (default 300)")
    p.add_argument("--env", action="append", type=values.env_pair, default=[], metavar="KEY=VALUE",
                   help="extra environment variable for every rank (repeatable)")
    p.add_argument("--legacy-launch", dest="legacy_launch", nargs="?", const="dash",
                   choices=("dash", "underscore"), default=None,
                   help="pass --local-rank=N (or --local_rank=N) in argv, as torch.distributed.launch did")
    p.add_argument("--start-method", dest="start_method", choices=START_METHODS, default="forkserver",
                   help="forkserver with torch preloaded (fast, default) or spawn (a fresh interpreter per rank)")
    p.add_argument("--ranks", dest="ranks_shown", type=values.int_list("--ranks"), default=None,
                   help="show only these ranks' output, e.g. 0 or 0,2 (all ranks still run; with --fake: "
                        "the ranks that run, each in its own process, default 0)")
    p.add_argument("--output", choices=OUTPUTS, default="auto",
                   help="auto: live widgets where a widget front end is connected, else text")
    p.add_argument("--same-lines", dest="same_lines", choices=SAME_LINES, default=None,
                   help="merge (default): a line several ranks print is shown once, as [ranks 0–3]:; apart: per rank")
    p.add_argument("--log-dir", dest="log_dir", default=None, help="where full per-rank logs are kept")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local (fast workers on this machine), torchrun (torch.distributed.run), slurm "
                        "(srun + torchrun per node) or ray (a Ray cluster, torchrun per node)")
    p.add_argument("--ray-address", dest="ray_address", default=None, metavar="ADDRESS",
                   help="the Ray cluster of --launcher ray: HOST:PORT, ray://HOST:PORT or auto "
                        "(default: RAY_ADDRESS, else a local Ray started for the cell)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default=None,
                   help="HOST:PORT every node meets at (torchrun launcher, c10d rendezvous)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="c10d",
                   help="torchrun's rendezvous backend (default c10d)")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default=None,
                   help="job id shared by all nodes of one job (torchrun launcher)")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts",
                   type=values.nonneg_int("--max-restarts"), default=0,
                   help="times torchrun restarts the ranks after a failure (torchrun launcher)")
    p.add_argument("--rdzv-timeout", "--rdzv_timeout", dest="rdzv_timeout", type=values.seconds("--rdzv-timeout"),
                   default=None, help="seconds to wait for every node to join (torchrun's rdzv join_timeout; "
                                      "with --launcher ray also for Ray to place every node's bundle)")
    p.add_argument("--gpus", type=values.int_list("--gpus"), default=None, help="CUDA devices to use, e.g. 0,1,3")
    p.add_argument("--fake", action="store_true",
                   help="plan the job at its real size: only rank 0 (or --ranks) of the -n world runs, on "
                        "torch's fake process-group backend (collectives move no data), and each shown rank "
                        "reports the parameter, gradient and optimizer bytes it holds and the collectives of "
                        "a step; build big models on the meta device")
    p.add_argument("--fresh", action="store_true", help="run a fresh job even while a pool runs")
    p.add_argument("--push", type=values.names, default=(), help="notebook names to send into every worker")
    p.add_argument("--pull", type=values.names, default=(), help="worker names to gather back (name or name@rank)")
    p.add_argument("--diff", type=values.diff_names, default=(), metavar="NAMES",
                   help="at the cell's end, compare these objects across the ranks and name what differs "
                        "(modules, optimizers, tensors, dicts/lists of them, rng), as %%ddp_diff")
    p.add_argument("--pdb", action="store_true",
                   help="the first rank to fail opens the debugger at the failing frame (as %%pdb)")
    p.add_argument("--export", default=None, metavar="SCRIPT.py", help="also write the cell as a torchrun script")
    p.add_argument("--ray", action="store_true",
                   help="with --export / %%ddp_export: also write SCRIPT_ray.py, a Ray job (ray job submit) "
                        "that runs the script with one torchrun per node")
    p.add_argument("--slurm", action="store_true",
                   help="with --export / %%ddp_export: also write SCRIPT.sbatch, a Slurm batch job")
    p.add_argument("--partition", type=values.slurm_name("--partition"), default=None, help="Slurm partition")
    p.add_argument("--account", type=values.slurm_name("--account"), default=None, help="Slurm account")
    p.add_argument("--time", dest="time_limit", type=values.slurm_time, default=None,
                   help="Slurm time limit of the job, e.g. 30 or 01:00:00")
    p.add_argument("--sbatch", action="append", type=values.sbatch_line, default=[], metavar="OPTION",
                   help="extra #SBATCH line for the exported job, e.g. --sbatch '--qos=high' (repeatable)")
    return p


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """Built once: declaring the options costs more than parsing a line (which keeps no state in it)."""
    return build_parser()


def parse_line(line: str, shape: LaunchSpec | None = None) -> LaunchSpec | None:
    """Parse the ``%%ddp`` line; returns None when only help was asked for. ``shape`` (a running
    pool's spec) gives the number of ranks and nodes when the line names none."""
    try:
        words = shlex.split(line, comments=False, posix=True)
    except ValueError as exc:
        raise DDPUsageError(f"%%ddp: cannot split the line: {exc}") from None
    script_args: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1:]
    words = _glue_sbatch(words)
    parser = _parser()
    try:
        ns = parser.parse_args(words)
    except _HelpShown:  # argparse's -h already printed the help
        return None
    if shape is not None and ns.n is None and ns.nproc_per_node is None and ns.nnodes == 1:
        ns.nproc_per_node, ns.nnodes = shape.nproc_per_node, shape.nnodes  # the pool's shape
    if shape is not None and ns.max_ranks is None:
        ns.max_ranks = shape.max_ranks  # a pool started past the machine's bound runs its cells
    return make_spec(n=ns.n, nproc_per_node=ns.nproc_per_node, nnodes=ns.nnodes, node_rank=ns.node_rank,
                     master_addr=ns.master_addr, master_port=ns.master_port, backend=ns.backend,
                     timeout=ns.timeout, idle_warning=ns.idle_warning, exit_grace=ns.exit_grace, env=dict(ns.env),
                     legacy_launch=ns.legacy_launch, start_method=ns.start_method,
                     ranks_shown=ns.ranks_shown, output=ns.output, same_lines=ns.same_lines, log_dir=ns.log_dir,
                     script_args=script_args, launcher=ns.launcher, rdzv_endpoint=ns.rdzv_endpoint,
                     rdzv_backend=ns.rdzv_backend, rdzv_id=ns.rdzv_id, max_restarts=ns.max_restarts,
                     rdzv_timeout=ns.rdzv_timeout,
                     gpus=ns.gpus, fresh=ns.fresh, push=ns.push, pull=ns.pull, diff=ns.diff, export=ns.export,
                     slurm=ns.slurm, partition=ns.partition, account=ns.account, time_limit=ns.time_limit,
                     sbatch=ns.sbatch, pdb=ns.pdb, max_ranks=ns.max_ranks, fake=ns.fake,
                     ray_address=ns.ray_address, ray=ns.ray)


def _glue_sbatch(words: list[str]) -> list[str]:
    """``--sbatch --qos=high`` → ``--sbatch=--qos=high`` (argparse would read --qos as an option)."""
    out: list[str] = []
    for word in words:
        if out and out[-1] == "--sbatch":
            out[-1] = f"--sbatch={word}"
        else:
            out.append(word)
    return out
