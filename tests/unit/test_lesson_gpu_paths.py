"""The lessons' GPU paths, checked here where no GPU runs them: every cell is read as Python (its
``%%ddp`` line aside) and every use of CUDA in it found: a ``torch.cuda.*`` call (but
``is_available``, ``device_count`` and the ``torch.cuda.amp`` constructors, which run on CPU), ``.cuda()``,
a ``"cuda"``/``"cuda:N"`` argument, ``device_id=``/``device_ids=``, and ``"nccl"`` given to
``init_process_group``/``new_group``. Then, on every lesson:

- each use sits in a branch that runs only with CUDA (``if torch.cuda.is_available()``, a name set from
  it, ``... else`` of ``if not ...``, ``x if use_cuda else y``), so the lesson runs on CPU;
- in a cell of several ranks (``%%ddp -n $world_size``) the branch also needs a GPU per rank:
  ``torch.cuda.device_count() >= LOCAL_WORLD_SIZE`` (any count that is not a constant), or
  ``nbddp.backend() == "nccl"``; ``is_available()`` alone sends rank 1 of a one-GPU machine to
  ``set_device(1)`` ("invalid device ordinal") or two NCCL ranks to one GPU. The same holds for a
  choice ``"nccl" if ... else "gloo"`` anywhere but a one-rank cell;
- a cell whose process group is made only with CUDA prints a line ``skipped: ...`` where it skips, so
  a reader on CPU sees why nothing ran;
- the lessons with such cells are notebooks/executed.py's GPU_LESSONS, and each names its GPU copy;
- every ``torch`` name such a branch calls exists in this torch, with the keywords it passes.

The rules are proven to fail on the patterns they are for, the old lines of lessons 04 and 09 among
them (``test_the_rules_catch_...``). What they cannot see (the numbers a GPU gives, a kernel's message)
is for the GPU copies (notebooks/executed.py --gpu).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import re

import nbformat
import pytest

from support.lessons import LESSONS, NOTEBOOKS, build, executed

# Where CUDA is used unguarded on purpose: (lesson, cell) -> why it runs on CPU.
ON_PURPOSE = {
    ("02", "legacy-launcher-local_rank-argv-ddp-2"):
        "torch.cuda.set_device(-1) is a no-op by torch's own rule: the lesson's point",
    ("21", "plan-code"): "run by nbddp.run(plan, n=N, fake=True): every group lands on torch's fake backend",
}
SAFE = {"torch.cuda.is_available", "torch.cuda.device_count"}
GROUP_MAKERS = ("init_process_group", "new_group")


def _python(source: str) -> tuple[str | None, str]:
    """A cell's ``%%`` magic line (None for plain Python) and its Python, line magics blanked."""
    lines = source.splitlines()
    magic = lines[0] if lines and lines[0].startswith("%%") else None
    body = lines[1:] if magic else lines
    return magic, "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in body)


def _none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _one_rank(magic: str | None) -> bool:
    return magic is not None and re.search(r"(^|\s)(-n|--nproc-per-node|--nproc_per_node)\s+1(\s|$)", magic) is not None


class Cell:
    """One cell's Python, with what it imports and what each node sits in."""

    def __init__(self, source: str):
        self.magic, code = _python(source)
        self.tree = ast.parse(code)
        self.aliases: dict[str, str] = {}
        self.values: dict[str, ast.expr] = {}   # a name set once at the top: what it was set to
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.values[stmt.targets[0].id] = stmt.value

    def dotted(self, node: ast.AST) -> str:
        """``dist.init_process_group`` as ``torch.distributed.init_process_group``; '' if not a plain name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return ""
        return ".".join([self.aliases.get(node.id, node.id), *reversed(parts)])

    # -- conditions: what is sure when a test is true (pos) and when it is false (neg)
    def condition(self, expr: ast.AST, depth: int = 0) -> tuple[set[str], set[str]]:
        if depth > 10:
            return set(), set()
        if isinstance(expr, ast.Call) and self.dotted(expr.func) == "torch.cuda.is_available":
            return {"cuda"}, set()
        if isinstance(expr, ast.Name) and expr.id in self.values:
            return self.condition(self.values[expr.id], depth + 1)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            pos, neg = self.condition(expr.operand, depth + 1)
            return neg, pos
        if isinstance(expr, ast.BoolOp):
            parts = [self.condition(v, depth + 1) for v in expr.values]
            union = lambda sets: set().union(*sets)  # noqa: E731
            inter = lambda sets: set.intersection(*sets)  # noqa: E731
            if isinstance(expr.op, ast.And):
                return union(p for p, _ in parts), inter([n for _, n in parts])
            return inter([p for p, _ in parts]), union(n for _, n in parts)
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
            left, op, right = expr.left, expr.ops[0], expr.comparators[0]
            if self._counts(right):   # n <= device_count()  ->  device_count() >= n
                left, right = right, left
                op = {ast.Lt: ast.Gt(), ast.LtE: ast.GtE(), ast.Gt: ast.Lt(), ast.GtE: ast.LtE()}.get(type(op), op)
            if self._counts(left):
                sure = {"cuda"} | (set() if isinstance(right, ast.Constant) else {"a GPU per rank"})
                if isinstance(op, (ast.Gt, ast.GtE)):
                    return sure, set()
                if isinstance(op, (ast.Lt, ast.LtE)):
                    return set(), sure
            backend = [side for side in (left, right) if isinstance(side, ast.Call)
                       and self.dotted(side.func) == "nbddp.backend"]
            nccl = [side for side in (left, right) if isinstance(side, ast.Constant) and side.value == "nccl"]
            if backend and nccl:
                sure = {"cuda", "a GPU per rank"}   # the launch chose nccl: a GPU for every rank
                return (sure, set()) if isinstance(op, ast.Eq) else (set(), sure) if isinstance(op, ast.NotEq) \
                    else (set(), set())
        return set(), set()

    def _counts(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.Name) and expr.id in self.values:
            expr = self.values[expr.id]
        return isinstance(expr, ast.Call) and self.dotted(expr.func) == "torch.cuda.device_count"

    def guard(self, node: ast.AST) -> set[str]:
        """What is sure wherever ``node`` runs, from the branches around it."""
        sure: set[str] = set()
        child, parent = node, self.parent.get(node)
        while parent is not None:
            if isinstance(parent, (ast.If, ast.IfExp, ast.While)):
                pos, neg = self.condition(parent.test)
                body = parent.body if isinstance(parent.body, list) else [parent.body]
                orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
                sure |= pos if child in body else neg if child in orelse else set()
            elif isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and child in parent.values:
                for before in parent.values[:parent.values.index(child)]:
                    sure |= self.condition(before)[0]
            child, parent = parent, self.parent.get(parent)
        return sure

    # -- what uses CUDA
    def cuda_uses(self) -> list[tuple[ast.AST, str]]:
        uses = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            name = self.dotted(node.func)
            said = ast.unparse(node)[:80]
            if name.startswith("torch.cuda.") and name not in SAFE and not name.startswith("torch.cuda.amp."):
                uses.append((node, said))
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and not name.startswith("torch."):
                uses.append((node, said))
            elif any(isinstance(a, ast.Constant) and isinstance(a.value, str) and re.fullmatch(r"cuda(:\d+)?", a.value)
                     for a in [*node.args, *(k.value for k in node.keywords)]):
                uses.append((node, said))
            elif any(k.arg in ("device_id", "device_ids") for k in node.keywords):
                for k in node.keywords:
                    value = k.value   # `device_ids=[r] if use_cuda else None`: the use is the branch with a device
                    if isinstance(value, ast.IfExp) and _none(value.orelse) != _none(value.body):
                        value = value.orelse if _none(value.body) else value.body
                    if k.arg in ("device_id", "device_ids") and not _none(value):
                        uses.append((value, said))
            elif name.endswith(GROUP_MAKERS):
                backend = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "backend"),
                                                               None)
                if isinstance(backend, ast.Constant) and isinstance(backend.value, str) and "nccl" in backend.value:
                    uses.append((node, said))
        return uses

    def backend_choices(self) -> list[ast.IfExp]:
        """``"nccl" if ... else "gloo"`` (either way round)."""
        return [node for node in ast.walk(self.tree) if isinstance(node, ast.IfExp)
                and {getattr(node.body, "value", None), getattr(node.orelse, "value", None)} == {"nccl", "gloo"}]

    def gpu_only_groups(self) -> list[ast.Call]:
        """The process groups this cell makes only with CUDA."""
        made = [node for node in ast.walk(self.tree) if isinstance(node, ast.Call)
                and self.dotted(node.func).endswith("init_process_group")]
        return [node for node in made if "cuda" in self.guard(node)]

    def says_skipped(self) -> bool:
        """A branch that runs without CUDA prints ``skipped: ...``."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.If):
                pos, neg = self.condition(node.test)
                without = node.orelse if "cuda" in pos else node.body if "cuda" in neg else []
                for stmt in without:
                    for call in ast.walk(stmt):
                        if isinstance(call, ast.Call) and self.dotted(call.func) == "print" and call.args:
                            first = call.args[0]
                            text = first.value if isinstance(first, ast.Constant) else (
                                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                                and isinstance(first.values[0], ast.Constant) else "")
                            if isinstance(text, str) and text.startswith("skipped: "):
                                return True
        return False


def problems(source: str) -> list[str]:
    """What is wrong with one cell's GPU path (empty: nothing)."""
    cell = Cell(source)
    if cell.magic and "--fake" in cell.magic:
        return []   # every group lands on torch's fake backend: "nccl" there needs no GPU
    found = []
    several = cell.magic is not None and cell.magic.startswith("%%ddp") and not _one_rank(cell.magic)
    for node, said in cell.cuda_uses():
        sure = cell.guard(node)
        if "cuda" not in sure:
            found.append(f"{said}: runs without CUDA too (put it under torch.cuda.is_available())")
        elif several and "a GPU per rank" not in sure:
            found.append(f"{said}: in a cell of several ranks, needs a GPU per rank "
                         "(torch.cuda.device_count() >= LOCAL_WORLD_SIZE), not only CUDA")
    if not _one_rank(cell.magic):
        for choice in cell.backend_choices():
            pos, neg = cell.condition(choice.test)
            if "a GPU per rank" not in (pos if choice.body.value == "nccl" else neg):
                found.append(f"{ast.unparse(choice)}: nccl needs a GPU per rank, not only CUDA")
    if cell.gpu_only_groups() and not cell.says_skipped():
        found.append("its process group is made only with CUDA, but no branch without CUDA prints 'skipped: ...'")
    return found


def _cells(name: str) -> list[tuple[str, str]]:
    """(cell id, source) of every code cell of a lesson, its mistakes too."""
    source = os.path.join(NOTEBOOKS, "src", name[:-6] + ".py")
    cells = [(c.id, c.source) for c in build.read_lesson(source).cells if c.cell_type == "code"]
    return cells + [(cid, text) for cid, text, _ in build.mistakes(source)]


@pytest.mark.parametrize("name", LESSONS)
def test_every_use_of_cuda_in_a_lesson_is_guarded_and_a_cell_of_several_ranks_asks_for_a_gpu_per_rank(name):
    wrong = [f"{cid}: {p}" for cid, text in _cells(name) if (name[:2], cid) not in ON_PURPOSE for p in problems(text)]
    assert not wrong, "\n".join(wrong)


def test_each_use_on_purpose_is_still_there_and_still_unguarded():
    """An exemption names a cell that exists and that the rules flag, or it hides nothing and goes."""
    for (number, cid), why in ON_PURPOSE.items():
        (name,) = [n for n in LESSONS if n.startswith(number)]
        cells = dict(_cells(name))
        assert cid in cells and problems(cells[cid]), f"{name}, cell {cid}: exempt ({why}) but nothing to exempt"


def test_the_lessons_with_gpu_cells_are_the_gpu_lessons_and_each_names_its_gpu_copy():
    with_gpu = [name[:-6] for name in LESSONS
                if any(Cell(text).gpu_only_groups() for _, text in _cells(name))]
    assert with_gpu == list(executed.GPU_LESSONS), (with_gpu, executed.GPU_LESSONS)
    for name in with_gpu:
        nb = build.read_lesson(os.path.join(NOTEBOOKS, "src", name + ".py"))
        prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert f"docs/lessons/gpu/{name}.ipynb" in prose, f"{name}: its prose does not say where its GPU run is"


def _torch_calls(cell: Cell):
    """(dotted name, call) of every call of a torch name in a branch that runs only with CUDA."""
    for node in ast.walk(cell.tree):
        if isinstance(node, ast.Call) and "cuda" in cell.guard(node):
            name = cell.dotted(node.func)
            if name.split(".")[0] == "torch":
                yield name, node


def _resolve(name: str):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)   # AttributeError: no such name in this torch
        return obj
    raise ImportError(name)


def api_problems(source: str) -> list[str]:
    """The torch names a cell's CUDA branches call that this torch lacks, or keywords they do not take."""
    cell, found = Cell(source), []
    for name, call in _torch_calls(cell):
        try:
            obj = _resolve(name)
        except (AttributeError, ImportError):
            found.append(f"{name}: not in this torch")
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            continue   # a builtin without a signature (torch.randn, torch.device)
        try:
            signature.bind_partial(*call.args, **{k.arg: k.value for k in call.keywords})
        except TypeError as exc:
            found.append(f"{ast.unparse(call)[:80]}: {exc}")
    return found


@pytest.mark.parametrize("name", [n + ".ipynb" for n in executed.GPU_LESSONS])
def test_the_torch_calls_of_the_gpu_branches_exist_in_this_torch_with_their_keywords(name):
    """torch 2.13 is the CPU build here, but the names and signatures are the same as the CUDA build's."""
    wrong = [f"{cid}: {p}" for cid, text in _cells(name) for p in api_problems(text)]
    assert not wrong, "\n".join(wrong)
    assert sum(1 for _, text in _cells(name) for _ in _torch_calls(Cell(text))) >= 5, "the branches were found"


# -- the rules fail on what they are for -----------------------------------------------------------------

OLD_04 = '''%%ddp -n $world_size --timeout 60
import argparse, os
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
args = argparse.ArgumentParser().parse_args()
use_cuda = torch.cuda.is_available()
if use_cuda:                                                                    # (2) GPU only, first
    torch.cuda.set_device(args.local_rank)
device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")
dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")   # (3)
model = DDP(torch.nn.Linear(64, 10).to(device), device_ids=[args.local_rank] if use_cuda else None)
'''
NEW_04 = OLD_04.replace("use_cuda = torch.cuda.is_available()",
                        'local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))\n'
                        "use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks")
OLD_09 = 'chosen = "nccl" if torch.cuda.is_available() else "gloo"\nassert in_use == [chosen] * world_size, in_use\n'
NEW_09 = OLD_09.replace("torch.cuda.is_available()", "torch.cuda.device_count() >= world_size")
OLD_04_FOUND = ["torch.cuda.set_device(args.local_rank): in a cell of several ranks, needs a GPU per rank",
                "torch.device('cuda', args.local_rank): in a cell of several ranks",
                "DDP(torch.nn.Linear(64, 10).to(device), device_ids=[args.local_rank] if use_cuda: in a cell",
                "'nccl' if use_cuda else 'gloo': nccl needs a GPU per rank"]
GPU_ONLY = '''%%ddp -n 1 --timeout 60
import os, torch, torch.distributed as dist
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here")
else:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    x = torch.ones(1).cuda()
'''


@pytest.mark.parametrize("source, wrong", [
    (OLD_04, OLD_04_FOUND),
    (NEW_04, []),
    (NEW_04.replace("if use_cuda:", "if True:"), ["torch.cuda.set_device(args.local_rank): runs without CUDA"]),
    (NEW_04.replace(" if use_cuda else torch.device", " if not use_cuda else torch.device"),
     ["torch.device('cuda', args.local_rank): runs without CUDA"]),
    (NEW_04.replace(">= local_ranks", ">= 1"), OLD_04_FOUND),   # >= 1 is only "there is CUDA"
    (NEW_04.replace("%%ddp -n $world_size", "%%ddp -n 1"), []),
    (OLD_04.replace("%%ddp -n $world_size", "%%ddp -n 1"), []),   # one rank: CUDA is enough
    (OLD_09, ["'nccl' if torch.cuda.is_available() else 'gloo': nccl needs a GPU per rank"]),
    (NEW_09, []),
    (GPU_ONLY, []),
    (GPU_ONLY.replace("%%ddp -n 1", "%%ddp -n $world_size"),
     ["torch.cuda.set_device(int(os.environ['LOCAL_RANK'])): in a cell of several ranks",
      "dist.init_process_group('nccl'): in a cell of several ranks",
      "torch.ones(1).cuda(): in a cell of several ranks"]),
    (GPU_ONLY.replace('print("skipped: no CUDA GPU here")', "pass"),
     ["its process group is made only with CUDA, but no branch without CUDA prints 'skipped: ...'"]),
    (GPU_ONLY.replace("if not torch.cuda.is_available():", "if torch.cuda.is_available():"),
     ["torch.cuda.set_device(int(os.environ['LOCAL_RANK'])): runs without CUDA",
      "dist.init_process_group('nccl'): runs without CUDA", "torch.ones(1).cuda(): runs without CUDA"]),
    ("%%ddp -n $world_size\nimport torch\nx = torch.zeros(2, device='cuda:1')\n",
     ["torch.zeros(2, device='cuda:1'): runs without CUDA"]),
    ("%%ddp -n $world_size\nimport nbddp, torch.distributed as dist\nif nbddp.backend() == 'nccl':\n"
     "    dist.init_process_group('nccl')\nelse:\n    print(f'skipped: {nbddp.backend()}')\n", []),
], ids=["old-04", "new-04", "unguarded", "wrong-way-round", "count-against-a-constant", "new-04-one-rank",
        "old-04-one-rank", "old-09", "new-09", "gpu-only", "gpu-only-several-ranks", "gpu-only-silent",
        "gpu-only-inverted", "device-string", "backend-of-the-launch"])
def test_the_rules_catch_unguarded_cuda_and_cuda_without_a_gpu_per_rank(source, wrong):
    found = problems(source)
    assert len(found) == len(wrong) and all(sum(f.startswith(w) for f in found) == 1 for w in wrong), found


def test_the_api_check_catches_a_name_or_keyword_this_torch_lacks():
    good = GPU_ONLY.replace('dist.init_process_group("nccl")',
                            'dist.init_process_group("nccl", device_id=torch.device("cuda", 0))')
    assert api_problems(good) == []
    assert api_problems(good.replace("device_id=", "device=")) == [
        "dist.init_process_group('nccl', device=torch.device('cuda', 0)): got an unexpected keyword argument 'device'"]
    assert api_problems(good.replace("torch.cuda.set_device", "torch.cuda.set_devices")) == [
        "torch.cuda.set_devices: not in this torch"]
    scaler = good + '    s = torch.amp.GradScaler("cuda", init_scales=2.0)\n'
    assert [p.split(": ")[-1] for p in api_problems(scaler)] == ["got an unexpected keyword argument 'init_scales'"]


# -- the GPU copies ---------------------------------------------------------------------------------------

def test_a_gpu_copy_is_written_only_from_a_run_whose_gpu_cells_ran(tmp_path):
    """notebooks/executed.py --gpu refuses a run that skipped its one-GPU cells (as the CPU copies did)
    or recorded no GPU; a run with CUDA becomes docs/lessons/gpu/NAME with its GPUs in the metadata."""
    name = executed.GPU_LESSONS[0] + ".ipynb"
    cpu_copy = os.path.join(executed.DOCS, name)
    gpus = {"gpus": 1, "names": ["NVIDIA H100 80GB HBM3"], "torch": "2.13.0+cu128", "cuda": "12.8"}
    with pytest.raises(executed.NotAGpuRun, match="skipped: no CUDA GPU here"):
        executed.write_copy(cpu_copy, name, str(tmp_path), gpus)
    ran = nbformat.read(cpu_copy, as_version=4)
    for cell in ran.cells:   # as if the GPU cells had run
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = output["text"].replace(executed.NO_CUDA, "on cuda:0")
    nbformat.write(ran, str(tmp_path / "ran.ipynb"))
    with pytest.raises(executed.NotAGpuRun, match="no GPUs recorded"):
        executed.write_copy(str(tmp_path / "ran.ipynb"), name, str(tmp_path / "gpu"), {"gpus": 0, "names": []})
    written = executed.write_copy(str(tmp_path / "ran.ipynb"), name, str(tmp_path / "gpu"), gpus)
    assert nbformat.read(written, as_version=4).metadata["gpu_run"] == gpus


def test_every_gpu_copy_is_a_gpu_run_of_its_lessons_current_cells():
    """docs/lessons/gpu/ holds only GPU runs (executed.gpu_run_problems) of GPU lessons, of the cells their
    sources build today, scrubbed of the machine. A lesson changed since its copy: run it again on a GPU
    machine, or delete the copy (the page "GPU runs" then says how it is made)."""
    folder = executed.GPU_DOCS
    copies = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if not copies:
        pytest.skip("no GPU copy yet: docs/lessons/gpu/ is made by notebooks/executed.py --gpu on a GPU machine")
    for name in copies:
        assert name[:-6] in executed.GPU_LESSONS, f"docs/lessons/gpu/{name}: not a lesson with GPU cells"
        copy = nbformat.read(os.path.join(folder, name), as_version=4)
        source = os.path.join(NOTEBOOKS, "src", name[:-6] + ".py")
        assert [(c.id, c.source) for c in copy.cells] == [(c.id, c.source) for c in build.read_lesson(source).cells], \
            f"docs/lessons/gpu/{name} was run from an older source: run it again on a GPU, or delete it"
        assert executed.gpu_run_problems(copy) == [], executed.gpu_run_problems(copy)
        assert executed.machine_paths(copy) == [], executed.machine_paths(copy)[:3]
