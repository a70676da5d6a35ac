"""Every rule on what a launch may ask for: the Python API's keywords (make_spec, given_or_made;
the ``%%ddp`` line comes through nbddp/core/ddpline.py), what fits a launcher or a running pool,
which process source runs a launch (choose_source), the cell's syntax. Pure; each bad argument
becomes a ``DDPUsageError`` (nbddp/core/errors.py) with a one-line reason, raised before
anything starts. Each option's own type and range: nbddp/core/optionvalues.py.
"""
from __future__ import annotations

import ipaddress
import os
import re
import warnings
from dataclasses import replace
from typing import Any

from nbddp.core import capacity, optionvalues as values
from nbddp.core.envvars import LAUNCHER_OWNED
from nbddp.core.errors import DDPUsageError
from nbddp.core.spec import BACKENDS, LAUNCHERS, OUTPUTS, SAME_LINES, START_METHODS, LaunchSpec


def make_spec(n: int | None = None, nproc_per_node: int | None = None, nnodes: int = 1,
              **options: Any) -> LaunchSpec:
    """Build a LaunchSpec from keyword options (the Python API's entry), checking them all."""
    nnodes = 1 if nnodes is None else nnodes
    for name, value in (("-n", n), ("--nproc-per-node", nproc_per_node), ("--nnodes", nnodes)):
        if value is not None and (not values.is_int(value) or value < 1 or values.huge(value)):
            raise DDPUsageError(f"%%ddp: {name} must be a whole number of at least 1, got {values.shown(value)}")
    if nproc_per_node is None:
        total = 1 * nnodes if n is None else n
        if total % nnodes:
            raise DDPUsageError(f"%%ddp: -n {total} ranks cannot be split evenly over --nnodes {nnodes}")
        nproc_per_node = total // nnodes
    elif n is not None and n != nproc_per_node * nnodes:
        raise DDPUsageError(f"%%ddp: -n {n} disagrees with --nproc-per-node {nproc_per_node} x "
                         f"--nnodes {nnodes} = {nproc_per_node * nnodes}")
    env = _env_pairs(options.pop("env", None))
    for key, _value in env:
        if not values.ENV_KEY.match(str(key)):
            raise DDPUsageError(f"%%ddp: --env key {values.shown(key)} is not a valid variable name")
    spec = LaunchSpec(nproc_per_node=nproc_per_node, nnodes=nnodes,
                      env=tuple((str(k), str(v)) for k, v in env))
    unknown = sorted(map(str, set(options) - _FIELDS))
    if unknown:
        raise DDPUsageError(f"%%ddp: unknown option{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(values.shown, unknown))} (the options are %%ddp's, with underscores)")
    options = {k: v for k, v in options.items() if v is not None or k in ("timeout", "idle_warning")}
    for key in ("script_args", "push", "pull", "diff", "sbatch", "ranks_shown", "gpus"):
        if options.get(key) is not None:
            if not isinstance(options[key], (list, tuple, range)):
                raise DDPUsageError(f"%%ddp: {values.flag(key)} takes a list, got {values.shown(options[key])}")
            options[key] = tuple(options[key])
    if isinstance(options.get("log_dir"), os.PathLike):
        options["log_dir"] = os.fspath(options["log_dir"])
    spec = replace(spec, **options)
    _check(spec)
    return _expanded(spec)


def _env_pairs(env: object) -> tuple[tuple[Any, ...], ...]:
    """``env=`` as (key, value) pairs: a dict, or pairs (the parser's)."""
    if env is None:
        return ()
    if isinstance(env, dict):
        return tuple(env.items())
    if isinstance(env, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in env):
        return tuple(tuple(p) for p in env)
    raise DDPUsageError(f"%%ddp: env takes a dict of variables, got {values.shown(env)}")


def _expanded(spec: LaunchSpec) -> LaunchSpec:
    """``--log-dir ~/logs`` (``--export ~/job.py``) is in the home folder, as a shell would
    expand it: a folder named ``~`` in the working folder is never what was meant."""
    for name in ("log_dir", "export"):
        path = getattr(spec, name)
        if path and path.startswith("~"):
            spec = replace(spec, **{name: os.path.expanduser(path)})
    return spec


_FIELDS = frozenset(LaunchSpec.__dataclass_fields__) - {"nproc_per_node", "nnodes", "env"}


def given_or_made(spec: LaunchSpec | None, n: int | None = None, options: dict[str, Any] | None = None,
                  shape: LaunchSpec | None = None) -> LaunchSpec:
    """The Python API's spec: the one the caller gave (checked again: a LaunchSpec can be built by
    hand), or one made from keyword options; both at once is refused. ``shape`` (a running pool's
    spec) gives the number of ranks and nodes when the options name none."""
    options = dict(options or {})
    if spec is not None:
        if n is not None or options:
            raise DDPUsageError(f"%%ddp: give spec= or options, not both (got spec= and "
                                f"{', '.join(['n'] * (n is not None) + sorted(options))})")
        if not isinstance(spec, LaunchSpec):
            raise DDPUsageError(f"%%ddp: spec= takes a LaunchSpec, got {values.shown(spec)}")
        _check(spec)
        return _expanded(spec)
    if shape is not None and n is None and not {"nproc_per_node", "nnodes"} & set(options):
        options.update(nproc_per_node=shape.nproc_per_node, nnodes=shape.nnodes)
    if shape is not None and options.get("max_ranks") is None and shape.max_ranks is not None:
        options["max_ranks"] = shape.max_ranks
    return make_spec(n=n, **options)


def check_host(host: str, who: str) -> None:
    """A host name or IP address a socket can be given: a name's labels 1–63 characters, 253 in
    all (IDNA; Python's resolver raises UnicodeError otherwise), no spaces or control characters."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return
    except ValueError:
        pass
    try:
        ascii_name = bare.rstrip(".").encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    if not ascii_name or len(ascii_name) > 253 or not re.match(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$", ascii_name):
        raise DDPUsageError(f"{who} takes a host name or IP address, got {values.shown(host)} (a name is "
                            "dot-separated labels of 1–63 letters, digits or hyphens)")


def check_log_dir(path: str) -> None:
    """``--log-dir``: a folder that is there and writable, or one that can be made in the nearest
    folder that is (checked before anything starts, not an OSError half-way)."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.lexists(full) and not os.path.isdir(full):
        raise DDPUsageError(f"%%ddp: --log-dir {path}: exists and is not a folder")
    parent = full
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise DDPUsageError(f"%%ddp: --log-dir {path}: {parent} is not a folder, so no folder can be made in it")
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "is not writable" if parent == full else f"cannot be made: {parent} is not writable"
        raise DDPUsageError(f"%%ddp: --log-dir {path} {what} by this user")


def _check_capacity(spec: LaunchSpec) -> None:
    """No more ranks than the machine runs (nbddp/core/capacity.py), unless --max-ranks says so:
    the local launcher runs every rank here, torchrun this node's, Slurm none."""
    if spec.launcher in ("slurm", "ray"):  # the cluster's nodes run the ranks
        here, machine = spec.world_size, None
    elif spec.fake:  # only the ranks it names run: the world is as large as asked
        here, machine = len(spec.ranks_run), capacity.machine()
        why = capacity.refusal(here, here, spec.max_ranks, machine, what="--fake --ranks:")
        if why:
            raise DDPUsageError(f"%%ddp: {why}")
        return
    else:
        here = spec.world_size if spec.launcher == "local" else spec.nproc_per_node
        machine = capacity.machine()
    why = capacity.refusal(here, spec.world_size, spec.max_ranks, machine)
    if why:
        raise DDPUsageError(f"%%ddp: {why}")


def _check(spec: LaunchSpec) -> None:
    values.check_types(spec)
    if spec.fake:
        check_fake(spec)
    _check_capacity(spec)
    if spec.backend not in BACKENDS:
        raise DDPUsageError(f"%%ddp: --backend must be one of {', '.join(BACKENDS)}, got {values.shown(spec.backend)}")
    if spec.start_method not in START_METHODS:
        raise DDPUsageError(f"%%ddp: --start-method must be one of {', '.join(START_METHODS)}")
    if spec.output not in OUTPUTS:
        raise DDPUsageError(f"%%ddp: --output must be one of {', '.join(OUTPUTS)}, got {values.shown(spec.output)}")
    if spec.same_lines is not None and spec.same_lines not in SAME_LINES:
        raise DDPUsageError(f"%%ddp: --same-lines must be one of {', '.join(SAME_LINES)}, "
                            f"got {values.shown(spec.same_lines)}")
    if spec.launcher not in LAUNCHERS:
        raise DDPUsageError(f"%%ddp: --launcher must be one of {', '.join(LAUNCHERS)}, "
                            f"got {values.shown(spec.launcher)}")
    if spec.master_port is not None and not 1 <= int(spec.master_port) <= 65535:
        raise DDPUsageError(f"%%ddp: port must be between 1 and 65535, got {spec.master_port}")
    if spec.timeout is not None and not spec.timeout > 0:
        raise DDPUsageError(f"%%ddp: --timeout must be more than 0 seconds, got {spec.timeout}")
    if spec.ranks_shown is not None:
        bad = [r for r in spec.ranks_shown if not 0 <= r < spec.world_size]
        if bad:
            raise DDPUsageError(f"%%ddp: --ranks {','.join(map(str, bad))} outside 0..{spec.world_size - 1}")
    if spec.node_rank is not None:
        if spec.launcher != "torchrun":
            raise DDPUsageError("%%ddp: --node-rank runs one node of a real multi-node job: "
                             "use it with --launcher torchrun (the local launcher simulates all nodes)")
        if spec.node_rank >= spec.nnodes:
            raise DDPUsageError(f"%%ddp: --node-rank {spec.node_rank} must be below --nnodes {spec.nnodes}")
    if not spec.master_addr:
        raise DDPUsageError("%%ddp: --master-addr must not be empty")
    check_host(spec.master_addr, "%%ddp: --master-addr")
    if spec.log_dir is not None:
        check_log_dir(spec.log_dir)
    for key, _ in spec.env:
        if key in LAUNCHER_OWNED:
            raise DDPUsageError(f"%%ddp: --env {key}=…: the launcher sets {key} for each rank, as torchrun "
                             f"does; {LAUNCHER_OWNED[key]}")
    if spec.launcher != "torchrun":
        for name, value in (("--rdzv-endpoint", spec.rdzv_endpoint), ("--rdzv-id", spec.rdzv_id),
                            ("--rdzv-timeout", spec.rdzv_timeout)):
            if name == "--rdzv-timeout" and spec.launcher == "ray":
                continue  # Ray's nodes join too: the placement's wait, then torchrun's join_timeout
            if value is not None:
                raise DDPUsageError(f"%%ddp: {name} is for a real multi-node job: use it with --launcher torchrun")
    if spec.launcher != "slurm" and not spec.slurm:
        slurm_options: tuple[tuple[str, object], ...] = (
            ("--partition", spec.partition), ("--account", spec.account), ("--time", spec.time_limit),
            ("--sbatch", spec.sbatch or None))
        for name, given in slurm_options:
            if given is not None:
                raise DDPUsageError(f"%%ddp: {name} is a Slurm option: use it with --launcher slurm, "
                                 "or with --export SCRIPT.py --slurm")
    if spec.launcher == "ray" and spec.gpus is not None:
        raise DDPUsageError("%%ddp: --gpus picks this machine's devices; on Ray each node's bundle gets "
                            "its ranks' GPUs from Ray: use --backend nccl (one GPU per rank)")
    if spec.ray_address is not None and spec.launcher != "ray":
        raise DDPUsageError("%%ddp: --ray-address names the Ray cluster of --launcher ray: use them together")
    if spec.launcher == "slurm" and spec.sbatch and not spec.slurm:
        raise DDPUsageError("%%ddp: --sbatch lines are for the exported job (--export SCRIPT.py --slurm); "
                         "a --launcher slurm cell takes --partition, --account and --time")
    if spec.launcher == "torchrun" and spec.nnodes > 1 and not spec.rdzv_endpoint:
        if spec.master_port is None:
            raise DDPUsageError(f"%%ddp: --nnodes {spec.nnodes} with --launcher torchrun needs a meeting point "
                                "every node can reach: --rdzv-endpoint HOST:PORT (c10d), or "
                                "--master-addr HOST --master-port PORT with --node-rank")
        if spec.node_rank is None:
            raise DDPUsageError("%%ddp: with --master-addr/--master-port (static rendezvous) each node needs "
                                f"its --node-rank (0..{spec.nnodes - 1}); or use --rdzv-endpoint HOST:PORT")
    if spec.launcher != "local" and (spec.push or spec.pull):
        raise DDPUsageError(_NO_VALUES_ACROSS.format(launcher=spec.launcher))
    if spec.launcher != "local" and spec.diff:
        raise DDPUsageError(f"%%ddp: --diff compares nbddp's own ranks, which meet in a folder on this "
                            f"machine; --launcher {spec.launcher}'s may run elsewhere")
    if spec.launcher != "local" and spec.pdb:
        raise DDPUsageError(f"%%ddp: --pdb debugs nbddp's own ranks, which the notebook's input box "
                            f"reaches; --launcher {spec.launcher}'s ranks have no way back to it")
    for item in spec.pull:
        name, _, rank = item.partition("@")
        if rank and (len(rank) > 18 or not int(rank) < spec.world_size):
            shown = f"{item}: rank {rank}" if len(rank) <= 18 else f"{values.shown(item)}: a rank"
            raise DDPUsageError(f"%%ddp: --pull {shown} outside 0..{spec.world_size - 1}")
    if spec.export is not None:
        check_script_name(spec.export, "%%ddp: --export")
    if spec.rdzv_endpoint is not None:
        match = re.match(r"^(\[[^\s\[\]]+\]|[^\s\[\]:]+|[^\s\[\]]+)(:\d{1,5})?$", spec.rdzv_endpoint)
        if not match:
            raise DDPUsageError(f"%%ddp: --rdzv-endpoint takes HOST[:PORT], got {values.shown(spec.rdzv_endpoint)}")
        check_host(match.group(1), "%%ddp: --rdzv-endpoint")


def check_fake(spec: LaunchSpec) -> None:
    """``--fake``: rank 0 (or ``--ranks``) of the world, each in a process of nbddp's own on
    torch's fake backend; what needs every rank, or a real network, does not fit."""
    if spec.launcher != "local":
        raise DDPUsageError(f"%%ddp: --fake runs chosen ranks of the world here, on torch's fake backend; "
                            f"--launcher {spec.launcher} starts every rank for real: drop one of them")
    if spec.backend in ("nccl", "mpi"):
        raise DDPUsageError(f"%%ddp: --fake puts every process group on torch's fake backend, so --backend "
                            f"{spec.backend} cannot apply: drop --backend (the cell's own "
                            "init_process_group(\"nccl\") is redirected too)")
    if spec.ranks_shown is not None and len(set(spec.ranks_shown)) != len(spec.ranks_shown):
        raise DDPUsageError("%%ddp: --fake --ranks names a rank twice")
    if spec.diff:
        raise DDPUsageError("%%ddp: --diff compares every rank's values, but --fake runs only the ranks it "
                            "names, and its collectives move no data: drop one of them")


_NO_VALUES_ACROSS = ("%%ddp: --push/--pull move values between the notebook and the local launcher's "
                     "ranks; with --launcher {launcher}, save and load files instead")


def check_script_name(path: str, who: str) -> None:
    if not isinstance(path, str) or not path or not path.endswith(".py"):
        raise DDPUsageError(f"{who}: the script name must end in .py, got {values.shown(path)}")
    if "\0" in path or not _encodable(path):
        raise DDPUsageError(f"{who}: the script name is not a file name (a NUL or a lone surrogate), "
                            f"got {values.shown(path)}")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def check_cell(source: str, who: str = "%%ddp", so: str = "so no rank was started") -> None:
    """The cell's syntax, checked here only, once, before any rank starts: a SyntaxError becomes
    a DDPUsageError that IPython shows as just the message (no frames from inside nbddp or
    IPython) and that still fails the cell for papermill. Line numbers are the notebook
    cell's (the magic's own line is line 1 of ``source``)."""
    try:  # compiled, not just parsed: a top-level return, yield or await is refused here too
        with warnings.catch_warnings():  # a SyntaxWarning ("is" with a literal) is each rank's to show
            warnings.simplefilter("ignore")
            compile(source, "<%%ddp cell>", "exec", dont_inherit=True)
    except ValueError as exc:  # a NUL in the source
        raise DDPUsageError(f"{who}: the cell cannot be compiled, {so}: {exc}") from None
    except SyntaxError as exc:
        where = f"cell line {exc.lineno}" if exc.lineno else "the cell"
        text = [f"{who}: {where} has a syntax error, {so}:"]
        if exc.text:
            code = exc.text.rstrip("\n")
            text.append("    " + code.strip())
            if exc.offset:
                indent = len(code) - len(code.lstrip())
                text.append("    " + " " * max(0, exc.offset - 1 - indent) + "^")
        text.append(f"SyntaxError: {exc.msg}")
        raise DDPUsageError("\n".join(text)) from None


# ------------------------------------------------------------ which source runs a launch
def choose_source(spec: LaunchSpec, *, pool: LaunchSpec | None = None, pool_ready: bool = True,
                  why_broken: str = "", func: bool = False, push: bool = False, args: bool = False,
                  own_env: bool = False) -> str:
    """Which process source runs a launch of ``spec`` (a name in nbddp/api.py's SOURCES: "local",
    "pool", "torchrun", "slurm" or "ray"), after the rules that tie
    a launch to its source. ``pool``: a started pool's spec (None: no pool), ready or not (and why
    it broke); ``func``: the target is a callable, not source text; ``push``: values to send;
    ``args``: args/kwargs for the target; ``own_env``: cwd or env_base given."""
    if spec.ray and not spec.export:
        raise DDPUsageError("%%ddp: --ray writes a Ray job next to the exported script: "
                            "use it with --export SCRIPT.py (or %ddp_export SCRIPT.py --ray)")
    if spec.slurm and not spec.export:
        raise DDPUsageError("%%ddp: --slurm writes a Slurm job next to the exported script: "
                            "use it with --export SCRIPT.py (or %ddp_export SCRIPT.py --slurm)")
    if func and spec.diff:
        raise DDPUsageError("%%ddp: --diff runs after the cell's code: give source text, not a callable")
    if func and spec.export:
        raise DDPUsageError("%%ddp: --export writes the cell's source as a script: give source text, "
                            "not a callable")
    if args and not func:
        raise DDPUsageError("%%ddp: args and kwargs are for a callable; a cell's source text takes "
                            "script arguments (script_args=[...], or after -- on the %%ddp line)")
    if spec.fake:
        return "local"  # a fake world is its own, never the pool's ranks
    if spec.launcher != "local":
        if func:
            raise DDPUsageError(f"%%ddp: --launcher {spec.launcher} runs the cell as a script: give its "
                                "source text (a callable runs on nbddp's own ranks: the local launcher)")
        if push:
            raise DDPUsageError(_NO_VALUES_ACROSS.format(launcher=spec.launcher))
        return spec.launcher
    if pool is None or spec.fresh:
        return "local"
    if not pool_ready:
        raise DDPUsageError(f"%%ddp: the pool is broken ({why_broken}); run %ddp_pool restart, or "
                            "%%ddp --fresh for a separate job" if why_broken else
                            "%%ddp: no pool is running; start one with %ddp_pool start -n N")
    if func:
        raise DDPUsageError("%%ddp: a pool runs cells given as source text; run a callable as a "
                            "fresh job (fresh=True)")
    if own_env:
        raise DDPUsageError("%%ddp: cwd and env_base are the pool's own (Pool(cwd=..., base_env=...)); "
                            "give them to Pool, or run a fresh job (fresh=True)")
    check_fits_pool(spec, pool)
    if spec.diff and spec.ranks_shown is not None and len(set(spec.ranks_shown)) < pool.world_size:
        raise DDPUsageError("%%ddp: --diff compares every rank of the pool, so the cell must run on all "
                            "of them (drop --ranks)")
    return "pool"



# ------------------------------------------------------------------- the pool
# Options that shape a job: a cell on a running pool cannot change them.
SHAPE_FIELDS = ("master_addr", "master_port", "backend", "env", "legacy_launch", "start_method",
                "script_args", "launcher", "gpus")


def check_fits_pool(spec: LaunchSpec, pool: LaunchSpec) -> None:
    """A cell on a running pool runs on its ranks as they are: it cannot change their shape."""
    default = LaunchSpec()
    changed = [name for name, mine, theirs in (("-n", spec.world_size, pool.world_size),
                                               ("--nnodes", spec.nnodes, pool.nnodes),
                                               ("--nproc-per-node", spec.nproc_per_node, pool.nproc_per_node))
               if mine != theirs]
    changed += [f"--{name.replace('_', '-')}" for name in SHAPE_FIELDS
                if getattr(spec, name) != getattr(default, name) and getattr(spec, name) != getattr(pool, name)]
    if changed:
        raise DDPUsageError(f"%%ddp: a pool of {pool.world_size} ranks is running, so {changed[0]} cannot "
                            f"change here; use --fresh for a separate job, or %ddp_pool restart with new options")


def check_pool_spec(spec: LaunchSpec) -> None:
    """A pool is nbddp's own ranks, kept between cells: the local launcher only."""
    if spec.fake:
        raise DDPUsageError("%ddp_pool: --fake runs a cell as chosen ranks of a fake world, once; a pool "
                            "keeps real ranks between cells: run such cells with %%ddp --fake")
    if spec.launcher != "local":
        raise DDPUsageError(f"%ddp_pool: a pool runs on the local launcher only, not --launcher "
                            f"{spec.launcher} (whose ranks end with each cell: run such cells with "
                            f"%%ddp --launcher {spec.launcher})")



# ------------------------------------------------------------ private network
def check_private_net(spec: LaunchSpec, env_name: str, master_is_loopback: bool) -> None:
    """With a private network for the kernel's ranks (``env_name``=1, nbddp/forkserver/privnet.py)
    they reach nothing beyond its loopback, and only the forkserver's children are inside it."""
    if spec.start_method == "spawn":
        raise DDPUsageError("%%ddp: --start-method spawn starts ranks outside the private network "
                            f"that {env_name}=1 gives this kernel's ranks; use the forkserver")
    if not master_is_loopback:
        raise DDPUsageError(f"%%ddp: --master-addr {spec.master_addr} is not this machine's loopback, "
                            f"but with {env_name}=1 ranks reach nothing beyond a private loopback; "
                            f"use --launcher torchrun to meet other machines")
