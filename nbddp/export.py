"""From notebook to cluster: write a ``%%ddp`` cell as a standalone script that runs under
``torchrun`` unchanged, and the exact torchrun command for each node.

The script is the cell as the ranks ran it: line 1 is the ``# %%ddp ...`` line, so a traceback
from the script names the same line numbers as the notebook; the commands follow as a comment
block at the end (built by nbddp/core/torchrun_cli.py). Nothing of nbddp is needed to run it.
"""
from __future__ import annotations

import ipaddress
import os
import shlex

from nbddp.core.spec import LaunchSpec, check_cell, check_script_name, parse_line
from nbddp.core.torchrun_cli import node_commands


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
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    commands = node_commands(spec, path)
    out = out or sys.stdout
    out.write(f"nbddp: wrote {path}; run it with torchrun:\n")
    if len(commands) == 1:
        out.write(f"  {commands[0]}\n")
    else:
        for node, command in enumerate(commands):
            out.write(f"  node {node}: {command}\n")
        out.write(_addr_note(spec).replace("#   ", "  ") + "\n")
    if spec.slurm:
        from nbddp.sources.slurm_script import sbatch_text

        job = path[:-3] + ".sbatch"
        with open(job, "w") as f:
            f.write(sbatch_text(spec, path, line))
        out.write(f"nbddp: wrote {job}; submit it from {os.path.dirname(job) or '.'}/ with: "
                  f"sbatch {os.path.basename(job)}\n")
    return commands


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
