"""From notebook to cluster: write a ``%%ddp`` cell as a standalone script that runs under
``torchrun`` unchanged, and the exact torchrun command for each node.

The script is the cell as the ranks ran it: line 1 is the ``# %%ddp ...`` line, so a traceback
from the script names the same line numbers as the notebook; the commands follow as a comment
block at the end (built by nbddp/core/torchrun_cli.py). Nothing of nbddp is needed to run it.
``--slurm`` also writes a Slurm batch job, ``--ray`` a Ray job (SCRIPT_ray.py: nbddp/core/rayjob.py)
that runs it with one torchrun per node.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import shlex

from nbddp.core import rayjob
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError
from nbddp.core.launchrules import check_cell, check_script_name
from nbddp.core.spec import LaunchSpec
from nbddp.core.torchrun_cli import MASK, node_commands


def script_text(body: str, spec: LaunchSpec, script: str) -> str:
    """The script: ``body`` (the cell, after its ``# %%ddp …`` line), then the commands as comments."""
    commands = node_commands(spec, os.path.basename(script))
    if not body.endswith("\n"):
        body += "\n"
    lines = ["", "", "# ---- exported by nbddp from a %%ddp cell; run it with torchrun:"]
    if len(commands) == 1:
        lines.append(f"#   {commands[0]}")
    else:
        for node, command in enumerate(commands):
            lines.append(f"#   node {node}: {command}")
        lines.append(_addr_note(spec))
    if spec.legacy_launch is not None:
        lines += ["#   (this cell reads --local-rank from argv, as under torch.distributed.launch;",
                  "#    to run it under torchrun, read int(os.environ['LOCAL_RANK']) instead)"]
        if spec.legacy_launch == "underscore":
            lines.append("#   (since torch 2.0 the launcher passes --local-rank, not --local_rank: "
                         "give your parser both names)")
    return body + "\n".join(lines) + "\n"


def _addr_note(spec: LaunchSpec) -> str:
    if spec.rdzv_endpoint:
        return ("#   (every node: same --rdzv-endpoint, a host:port all nodes reach; the node ranks "
                "are assigned at the rendezvous)")
    note = "#   (--master-addr must be node 0's address, reachable from every node"
    if _names_this_machine(spec.master_addr):
        note += f"; {spec.master_addr!r} only works when all nodes are this machine"
    return note + ")"


def _names_this_machine(addr: str) -> bool:
    """localhost or a loopback address (no name lookup: a cluster's names mean nothing here)."""
    if addr.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def export_cell(path: str, cell: str, line: str = "", spec: LaunchSpec | None = None, out=None) -> list[str]:
    """Write ``cell`` (run as ``%%ddp line``) to ``path`` as a torchrun script, print the
    commands; returns them."""
    check_script_name(path, "%ddp_export")
    if spec is None:
        spec = parse_line(line)
        if spec is None:
            return []
    line = _without_export(line)
    body = f"# %%ddp {line.strip()}\n{cell}"
    check_cell(body, "%ddp_export", "so nothing was written")
    return _write(path, body, line, spec, out)


def export_source(path: str, source: str, spec: LaunchSpec, out=None) -> list[str]:
    """``nbddp.run(source, export=path)``: ``source`` as the script (a ``# %%ddp …`` first line,
    as the magic gives, loses its ``--export``); the caller checked its syntax."""
    first, newline, rest = source.partition("\n")
    line = ""
    if first.startswith("# %%ddp "):
        line = _without_export(first[len("# %%ddp "):])
        source = f"# %%ddp {line}{newline}{rest}"
    return _write(path, source, line, spec, out)


def _write(path: str, body: str, line: str, spec: LaunchSpec, out) -> list[str]:
    import sys

    text = script_text(body, spec, path)
    folder = os.path.dirname(os.path.abspath(path))
    secret = bool(spec.env)  # --env values may be secrets (a token, a password): files 0600, shown masked
    try:
        os.makedirs(folder, exist_ok=True)
        _save(path, text, secret)
        job = None
        if spec.slurm:
            from nbddp.sources.slurm_script import sbatch_text

            job = path[:-3] + ".sbatch"
            _save(job, sbatch_text(spec, path, line), secret)
        ray_job = None
        if spec.ray:
            ray_job = rayjob.job_path(path)
            _save(ray_job, rayjob.job_script(spec, path, line), secret)
    except OSError as exc:
        why = ("it is a symbolic link (nbddp writes no file through one)" if exc.errno == errno.ELOOP
               else exc.strerror or str(exc))
        raise DDPUsageError(f"%ddp_export: cannot write {exc.filename or path}: {why}") from None
    commands = node_commands(spec, path)
    shown = node_commands(spec, path, masked=True)
    out = out or sys.stdout
    out.write(f"nbddp: wrote {path}; run it with torchrun:\n")
    if len(shown) == 1:
        out.write(f"  {shown[0]}\n")
    else:
        for node, command in enumerate(shown):
            out.write(f"  node {node}: {command}\n")
        out.write(_addr_note(spec).replace("#   ", "  ") + "\n")
    if secret:
        out.write(f"  (--env values shown as {MASK}: the command with them is at the end of {path}, "
                  "which only you can read)\n")
    if job:
        out.write(f"nbddp: wrote {job}; submit it from {os.path.dirname(job) or '.'}/ with: "
                  f"sbatch {os.path.basename(job)}\n")
    if ray_job:
        out.write(f"nbddp: wrote {ray_job}; submit it to a Ray cluster from {os.path.dirname(ray_job) or '.'}/ "
                  f"with: {rayjob.submit_command(path)}\n")
    return commands


def _save(path: str, text: str, secret: bool) -> None:
    """Write ``path`` anew: mode 0600 where it holds ``--env`` values (also when an older file of
    that name was readable by others), never through a symbolic link planted under its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600 if secret else 0o666)
    with open(fd, "w") as f:
        if secret:
            os.fchmod(fd, 0o600)
        f.write(text)


def _without_export(line: str) -> str:
    """The %%ddp line without its --export option (the exported script's first line)."""
    words = shlex.split(line)
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--export":
            skip = True
            continue
        if word.startswith("--export="):
            continue
        kept.append(word)
    return shlex.join(kept)
