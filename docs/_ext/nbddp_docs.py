"""Reference tables generated from nbddp itself at build time, so they cannot drift from the code.

Directives (used in docs/reference/*.md and docs/tutorials/index.md):

``{nbddp-options}``   every option of the ``%%ddp`` line parser (nbddp.core.ddpline.build_parser), which
                      ``%ddp_pool start|restart`` and ``%ddp_export`` parse too
``{nbddp-magics}``    the four magics' own usage and docstrings (nbddp.magic.DDPMagics, linecommands.POOL_USAGE)
``{nbddp-hints}``     every hint nbddp gives (nbddp.core.diagnosis.HINTS and the private-network hint),
                      with the error text that triggers it
``{nbddp-lessons}``   the lessons (docs/lessons/*.ipynb), each with its page and how to open it
``{nbddp-gpu-runs}``  the lessons with GPU cells (notebooks/executed.py's GPU_LESSONS), each with its run on
                      a GPU (docs/lessons/gpu/NN_name.ipynb) where one was made, or how to make it; and a
                      hidden toctree of the runs that exist (none: no toctree, so no empty glob)

Each lesson page (lessons/*.ipynb) also gets, at its top, how to open it in JupyterLab (and on
Binder, where ``nbddp_binder_repo`` in conf.py names the repository); a lesson with GPU cells, where its
run on a GPU is (or the page GPU runs, while there is none), and a GPU run, which lesson it is.
"""
from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import json
import os
import shutil

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.directives.other import TocTree

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "notebooks")

# Where an option is explained beyond its one line (a docs page); options not named here have none.
MORE = {
    "nnodes": "/howto/cluster", "node_rank": "/howto/cluster", "master_addr": "/howto/cluster",
    "master_port": "/howto/cluster", "backend": "/howto/gpus", "gpus": "/howto/gpus",
    "timeout": "/howto/troubleshooting", "idle_warning": "/howto/troubleshooting",
    "legacy_launch": "/howto/cluster", "start_method": "/explanation/performance",
    "output": "/explanation/display", "same_lines": "/explanation/display", "ranks_shown": "/howto/pools",
    "log_dir": "/explanation/security", "launcher": "/howto/cluster", "rdzv_endpoint": "/howto/cluster",
    "rdzv_backend": "/howto/cluster", "rdzv_id": "/howto/cluster", "max_restarts": "/howto/cluster",
    "rdzv_timeout": "/howto/cluster", "fresh": "/howto/pools", "push": "/howto/pools", "pull": "/howto/pools",
    "diff": "/howto/pools", "pdb": "/howto/debugging", "export": "/howto/cluster", "slurm": "/howto/cluster",
    "partition": "/howto/cluster", "account": "/howto/cluster", "time_limit": "/howto/cluster",
    "sbatch": "/howto/cluster", "ray_address": "/howto/cluster", "ray": "/howto/cluster",
}

# An error text that triggers each hint (matched by the hint's own pattern in tests/unit/test_docs_sources.py),
# keyed by the pattern's source; a hint without one shows its pattern alone.
EXAMPLES = {
    "environment variable (MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE) expected":
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
        "MASTER_ADDR expected, but not set",
    r"\) is held by another process on this machine":
        "RendezvousError: port 12355 (set at cell line 4: os.environ[\"MASTER_PORT\"] = \"12355\") is held by "
        "another process on this machine",
    r"\) (is not an address of this machine|does not resolve)":
        "RendezvousError: MASTER_ADDR '10.255.255.1' (set at cell line 3: …) is not an address of this machine",
    r"world_size=\d+ \(.*\) but this %%ddp launch has \d+ ranks":
        "RendezvousError: world_size=4 (set at cell line 5: …) but this %%ddp launch has 2 ranks",
    "EADDRINUSE|address already in use": "RuntimeError: … EADDRINUSE: address already in use",
    "Default process group has not been initialized":
        "ValueError: Default process group has not been initialized, please make sure to call "
        "init_process_group.",
    "DDP expects same model across all ranks|appears not to match (sizes|strides) of the same param in process 0":
        "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 2 params, while rank 1 has "
        "inconsistent 4 params.",
    "Detected mismatch between collectives":
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: …BROADCAST…",
    "CUDA out of memory|OutOfMemoryError": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …",
    "has no attribute '_cuda_setDevice'": "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
    "doesn't have NCCL built in|NCCL support is not compiled|ProcessGroupNCCL is only supported with GPUs":
        "RuntimeError: Distributed package doesn't have NCCL built in",
    "No CUDA GPUs are available|Found no NVIDIA driver|no CUDA-capable device":
        "RuntimeError: No CUDA GPUs are available",
    "ranks have no stdin|EOF when reading a line":
        "NoStdin: input('lr? '): ranks have no stdin, so input() cannot ask for a value",
    r"mismatch between collectives|preamble\.length|op\.preamble|Mismatch in (sizes|tensor)":
        "RuntimeError: [gloo/transport/tcp/pair.cc:…] op.preamble.length <= op.nbytes. 8 vs 4",
    "invalid device ordinal|Duplicate GPU detected|device not set":
        "torch.AcceleratorError: CUDA error: invalid device ordinal",
    "ncclInvalidUsage|NCCL error.*invalid usage":
        "torch.distributed.DistBackendError: NCCL error in: …/NCCLUtils.cpp:77, invalid usage (run with "
        "NCCL_DEBUG=WARN for details), NCCL version 2.27.5",
    "device_id \\S+ does not match the current compilation's accelerator support|device_id is an int, but no "
    "accelerator support|device_id parameter must be an accelerator":
        "ValueError: device_id cuda:0 does not match the current compilation's accelerator support: None.",
    "device_ids and output_device arguments only work with .*module parameters \\{device\\(type='cpu'\\)\\}":
        "ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device/"
        "multiple-device GPU modules or CPU modules, but got device_ids [0], output_device None, and module "
        "parameters {device(type='cpu')}.",
    "Torch not compiled with CUDA enabled|Cannot access accelerator device when none is available|"
    "has no attribute '_cuda_":
        "RuntimeError: Cannot access accelerator device when none is available.",
    "Connection closed by peer|Connection reset by peer|connection reset|Broken pipe":
        "RuntimeError: [gloo/transport/tcp/pair.cc:…] Connection closed by peer [127.0.0.1]:45678",
    "timed out.*(collective|wait|store)|Socket Timeout|Timed out waiting":
        "torch.distributed.DistStoreError: Timed out waiting for clients. 1/2 clients joined.",
}


def _text(value: str, literal: bool = False) -> nodes.Node:
    return nodes.literal(value, value) if literal else nodes.Text(value)


def _entry(*children) -> nodes.entry:
    para = nodes.paragraph()
    for child in children:
        para += child if isinstance(child, nodes.Node) else nodes.Text(str(child))
    entry = nodes.entry()
    entry += para
    return entry


def _table(header: list[str], rows: list[list[nodes.entry]], widths: list[int], ids: str) -> nodes.table:
    table = nodes.table(ids=[ids], classes=["nbddp-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for name in header:
        row += _entry(name)
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += cell
        body += row
    return table


def _doc_ref(target: str, short: bool = False) -> addnodes.pending_xref:
    """A link to page ``target``: its title, or (``short``) the page's file name."""
    ref = addnodes.pending_xref("", refdomain="std", reftype="doc", reftarget=target, refexplicit=short,
                                refwarn=True)
    ref += nodes.inline("", target.rsplit("/", 1)[-1])
    return ref


def option_rows(parser: argparse.ArgumentParser) -> list[dict]:
    """One dict per option of the parser: its strings, the value it takes, default and help."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            strings, value, default = list(action.option_strings), "", ""
            text = action.help
        else:
            strings = list(action.option_strings)
            if action.choices:
                value = "|".join(map(str, action.choices))
            elif action.nargs == 0:
                value = ""
            else:
                value = action.metavar or action.dest.upper()
            if action.nargs == "?":
                value = f"[{value}]"
            default = action.default
            if isinstance(action, argparse._StoreTrueAction):
                default = "off"
            elif default in (None, [], ()):
                default = ""
            text = action.help or ""
            try:
                text = text % {**vars(action), "prog": parser.prog}
            except (KeyError, TypeError, ValueError):
                text = text.replace("%%", "%")
            if isinstance(action, argparse._AppendAction):
                text += " (repeatable)" if "repeatable" not in text else ""
        rows.append({"strings": strings, "value": value, "default": str(default), "help": text,
                     "dest": action.dest})
    return rows


class OptionsDirective(Directive):
    has_content = False

    def run(self):
        from nbddp.core.ddpline import build_parser

        parser = build_parser()
        rows = []
        for option in option_rows(parser):
            first = nodes.entry()
            para = nodes.paragraph()
            for i, string in enumerate(option["strings"]):
                if i:
                    para += nodes.Text(", ")
                para += nodes.literal(string, string)
            first += para
            first["ids"] = [nodes.make_id("option " + option["strings"][-1 if option["dest"] == "help" else 0]
                                          .lstrip("-") or option["dest"])]
            more = _entry(_doc_ref(MORE[option["dest"]], short=True)) if option["dest"] in MORE else _entry("")
            rows.append([first, _entry(_text(option["value"], True) if option["value"] else ""),
                         _entry(_text(option["default"], True) if option["default"] else ""),
                         _entry(option["help"]), more])
        usage = parser.format_usage().replace("usage: ", "").strip()
        block = nodes.literal_block(usage, usage, language="text")
        return [block, _table(["option", "value", "default", "what it does", "more"], rows,
                              [22, 16, 10, 42, 10], "options-table")]


class MagicsDirective(Directive):
    has_content = False

    def run(self):
        from nbddp.core import linecommands
        from nbddp.magic import DDPMagics

        out = []
        for title, func, usage in (
                ("%%ddp", DDPMagics.ddp, "%%ddp [options] [-- script arguments]"),
                ("%ddp_pool", DDPMagics.ddp_pool, linecommands.POOL_USAGE.replace("usage: ", "")),
                ("%ddp_diff", DDPMagics.ddp_diff, linecommands.DIFF_USAGE.replace("usage: ", "")),
                ("%ddp_export / %%ddp_export", DDPMagics.ddp_export, "%ddp_export SCRIPT.py [options]")):
            section = nodes.section(ids=[nodes.make_id("magic " + title.split()[0])])
            section += nodes.title(title, title)
            section += nodes.literal_block(usage, usage, language="text")
            doc = " ".join((func.__doc__ or "").split())
            if doc:
                section += nodes.paragraph(doc, doc.replace("``", ""))
            out.append(section)
        commands = ", ".join(linecommands.POOL_COMMANDS)
        out[1] += nodes.paragraph("", f"Commands: {commands}. start and restart take the %%ddp options below.")
        flags = ", ".join(linecommands._SLURM_JOB_FLAGS)
        out[3] += nodes.paragraph("", f"Options that only shape the Slurm job ({flags}) add to the last cell's "
                                      "options; any other option replaces them.")
        return out


class HintsDirective(Directive):
    has_content = False

    def run(self):
        from nbddp.core import diagnosis

        rows = []
        for pattern, hint in hints():
            example = EXAMPLES.get(pattern.pattern)
            trigger = _entry(*([_text(example, True), nodes.Text(" — matched as ")] if example else []),
                             _text(pattern.pattern, True))
            rows.append([trigger, _entry(hint)])
        private = _entry(_text("Network is unreachable", True), nodes.Text(" (or a failed name lookup) in a rank "
                                                                           "of a kernel with a private network"))
        rows.append([private, _entry(diagnosis.PRIVATE_NET_HINT)])
        return [_table(["the error text (matched as)", "the hint nbddp adds"], rows, [45, 55], "hints-table")]


def hints():
    from nbddp.core import diagnosis

    return list(diagnosis.HINTS)


def lessons(srcdir: str) -> list[tuple[str, str]]:
    """(name, title) of each executed lesson, in order."""
    found = []
    for path in sorted(glob.glob(os.path.join(srcdir, "lessons", "*.ipynb"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            cells = json.load(f)["cells"]
        title = name
        for cell in cells:
            if cell["cell_type"] == "markdown":
                for line in "".join(cell["source"]).splitlines():
                    if line.startswith("# "):
                        title = line[2:].strip()
                        break
                break
        found.append((name, title))
    return found


@functools.cache
def _gpu_lessons() -> tuple[str, ...]:
    """notebooks/executed.py's GPU_LESSONS: the lessons with cells that run only with CUDA."""
    spec = importlib.util.spec_from_file_location("lessons_executed", os.path.join(NOTEBOOKS, "executed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.GPU_LESSONS)


GPU_PAGE = "/tutorials/gpu"


def gpu_runs(env) -> dict[str, dict]:
    """The runs on a GPU that exist (lessons/gpu/NAME among the site's documents): name -> its gpu_run metadata."""
    found = {}
    for docname in sorted(env.found_docs):
        if docname.startswith("lessons/gpu/"):
            name = docname.rsplit("/", 1)[1]
            with open(os.path.join(env.srcdir, docname + ".ipynb")) as f:
                found[name] = json.load(f)["metadata"].get("gpu_run", {})
    return found


def _machine(run: dict) -> str:
    names = " + ".join(run.get("names", [])) or "a GPU"
    return f"{run.get('gpus', '?')} × {names}, torch {run.get('torch', '?')}"


class GpuRunsDirective(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        runs = gpu_runs(env)
        rows = []
        for name in _gpu_lessons():
            if name in runs:
                made = _entry(_doc_ref(f"/lessons/gpu/{name}", short=True), f" (ran on {_machine(runs[name])})")
            else:
                command = f"python notebooks/executed.py --gpu {name}"
                made = _entry("not made yet: ", _text(command, True))
            rows.append([_entry(_doc_ref(f"/lessons/{name}")), made])
        return [_table(["lesson (its run on CPU)", "its run on a GPU"], rows, [50, 50], "gpu-runs-table")]


class GpuToctreeDirective(TocTree):
    """A hidden toctree of the GPU runs that exist; nothing where there are none."""

    has_content = False
    option_spec = {}

    def run(self):
        names = gpu_runs(self.env)
        if not names:
            return []
        self.content = StringList([f"/lessons/gpu/{name}" for name in names])
        self.options = {"hidden": True, "maxdepth": 1}
        return super().run()


def _gpu_line(app, docname: str) -> nodes.paragraph | None:
    """For a lesson with GPU cells, where its run on a GPU is; for a GPU run, which lesson it is."""
    name = docname.rsplit("/", 1)[1]
    if name not in _gpu_lessons():
        return None
    para = nodes.paragraph(classes=["nbddp-gpu"])
    runs = gpu_runs(app.env)
    if docname.startswith("lessons/gpu/"):
        para += nodes.Text(f"This is the lesson as it ran on a GPU ({_machine(runs.get(name, {}))}); ")
        para += _doc_ref(f"/lessons/{name}", short=True)
        para += nodes.Text(" is its run on CPU, and ")
        para += _doc_ref(GPU_PAGE)
        para += nodes.Text(" lists the others.")
    elif name in runs:
        para += nodes.Text("This page ran on CPU, where the cells that need CUDA say they were skipped; its run "
                           "on a GPU: ")
        para += _doc_ref(f"/lessons/gpu/{name}", short=True)
        para += nodes.Text(".")
    else:
        para += nodes.Text("This page ran on CPU, where the cells that need CUDA say they were skipped; no run on "
                           "a GPU is here yet (")
        para += _doc_ref(GPU_PAGE)
        para += nodes.Text(" says how one is made).")
    return para


def _open_here(app, name: str, up: str = "../") -> nodes.paragraph:
    """How to open lesson ``name``: JupyterLab from a checkout, and Binder where configured (``up``: from
    the page to the site's top)."""
    para = nodes.paragraph(classes=["nbddp-open"])
    para += nodes.Text("Open it to run: ")
    if os.path.exists(os.path.join(NOTEBOOKS, f"{name}.ipynb")):
        para += nodes.reference("", "download the notebook", refuri=f"{up}notebooks/{name}.ipynb")
        para += nodes.Text(" and open it in JupyterLab, or ")
    command = f"jupyter lab notebooks/{name}.ipynb"
    para += nodes.literal(command, command)
    para += nodes.Text(" (from a checkout, after ")
    para += nodes.literal("bash scripts/demo.sh", "bash scripts/demo.sh")
    para += nodes.Text(")")
    repo = app.config.nbddp_binder_repo
    if repo:
        url = f"https://mybinder.org/v2/gh/{repo}/HEAD?labpath=notebooks%2F{name}.ipynb"
        para += nodes.Text(", or ")
        para += nodes.reference("", "open it on Binder", refuri=url)
    para += nodes.Text(".")
    return para


class LessonsDirective(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        rows = []
        for name, _title in lessons(env.srcdir):
            rows.append([_entry(_doc_ref(f"/lessons/{name}")), _entry(_text(f"notebooks/{name}.ipynb", True))])
        return [_table(["lesson (its page, as it ran)", "the notebook to run"], rows, [65, 35], "lessons-table")]


def add_open_line(app, doctree):
    """At the top of each lesson page: how to open it in JupyterLab (and on Binder)."""
    docname = app.env.docname
    if not docname.startswith("lessons/"):
        return
    name = docname.rsplit("/", 1)[1]
    for section in doctree.findall(nodes.section):
        title = next(iter(section.findall(nodes.title)), None)
        index = section.index(title) + 1 if title is not None else 0
        section.insert(index, _open_here(app, name, "../" * docname.count("/")))
        gpu = _gpu_line(app, docname)
        if gpu is not None:
            section.insert(index + 1, gpu)
        return


def reread_gpu_pages(app, env, added, changed, removed):
    """The pages that say which GPU runs exist are read again on every build (a run added or removed
    changes them, not their sources)."""
    return [GPU_PAGE.lstrip("/"), *(f"lessons/{name}" for name in _gpu_lessons())]


def copy_notebooks(app, exception):
    """The lessons as learners get them (notebooks/NN_name.ipynb, unexecuted) beside the site, for the
    lesson pages' download links."""
    if exception is not None or app.builder.format != "html":
        return
    out = os.path.join(app.outdir, "notebooks")
    os.makedirs(out, exist_ok=True)
    for path in glob.glob(os.path.join(NOTEBOOKS, "[0-9][0-9]_*.ipynb")):
        shutil.copyfile(path, os.path.join(out, os.path.basename(path)))


def setup(app):
    app.add_config_value("nbddp_binder_repo", "", "env")
    app.add_directive("nbddp-options", OptionsDirective)
    app.add_directive("nbddp-magics", MagicsDirective)
    app.add_directive("nbddp-hints", HintsDirective)
    app.add_directive("nbddp-lessons", LessonsDirective)
    app.add_directive("nbddp-gpu-runs", GpuRunsDirective)
    app.add_directive("nbddp-gpu-toctree", GpuToctreeDirective)
    app.connect("doctree-read", add_open_line)
    app.connect("env-get-outdated", reread_gpu_pages)
    app.connect("build-finished", copy_notebooks)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
