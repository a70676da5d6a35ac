"""In a rank: ``%ddp_diff``'s and ``--diff``'s side. The named objects become entries (a
module's parameters and buffers, an optimizer's state and hyperparameters, tensors in dicts and
lists, ``rng``: the generators' states), each hashed here; the ranks meet in the kernel's
private folder, not in a collective (the process group may be broken or busy): each writes its
summary, reads the others', and the ranks whose first differing tensors differ compute them
against the copy rank 0 writes (a few tensors only, nbddp/core/rankdiff.py). Every wait has a
deadline; the kernel reads the files.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

from nbddp.core import rankdiff

_CHUNK = 1 << 22  # elements computed at a time: the difference never costs a whole float64 copy


def exchange(namespace: dict, names, folder: str, wait: float = rankdiff.WAIT) -> None:
    """Summarize ``names`` from ``namespace``, meet the other ranks in ``folder``, compute."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + wait
    try:
        tensors, summary = summarize(namespace, names)
    except Exception as exc:  # said in the summary, so no rank waits for this one in vain
        tensors, summary = {}, {"entries": [], "problems": [f"rank {rank} could not summarize: "
                                                             f"{type(exc).__name__}: {exc}"]}
    _write(folder, f"summary-{rank}.json", summary)
    summaries = {}
    for other in range(world):
        found = _read(folder, f"summary-{other}.json", deadline)
        if found is None:
            return  # the kernel says which rank never came
        summaries[other] = found
    if rankdiff.problems(summaries):
        return
    chosen = rankdiff.to_compute(rankdiff.compare(summaries))
    if rank == 0 and chosen:
        import torch

        part = os.path.join(folder, "values-0.pt.part")
        torch.save({name: _local(tensors[name]).detach().cpu() for name, _ in chosen}, part)
        os.rename(part, os.path.join(folder, "values-0.pt"))
    mine = [name for name, ranks in chosen if rank in ranks]
    computed = {}
    if mine and _wait_for(os.path.join(folder, "values-0.pt"), deadline):
        import torch

        ref = torch.load(os.path.join(folder, "values-0.pt"), weights_only=True)
        computed = {name: _max_abs_diff(_local(tensors[name]), ref[name]) for name in mine}
    _write(folder, f"computed-{rank}.json", computed)


def summarize(namespace: dict, names) -> tuple[dict, dict]:
    """({entry name: tensor}, the summary sent: its entries and the problems met)."""
    items: list[tuple[str, object]] = []
    problems: list[str] = []
    for name in names:
        if name == "rng":
            items.extend(_rng_states())
            continue
        head, *path = name.split(".")
        if head not in namespace:
            problems.append(f"no name {head!r}")
            continue
        obj = namespace[head]
        try:
            for part in path:
                obj = getattr(obj, part)
        except AttributeError:
            problems.append(f"{name!r}: no attribute {part!r}")
            continue
        _expand(name, obj, items, problems, _param_names(namespace, names))
    tensors, entries = {}, []
    for name, value in items:
        entries.append(_entry(name, value))
        if entries[-1][1] == rankdiff.TENSOR:
            tensors[name] = value
    return tensors, {"entries": entries, "problems": problems}


def _expand(name: str, obj, items: list, problems: list, params: dict) -> None:
    import torch

    if isinstance(obj, torch.Tensor):
        items.append((name, obj))
    elif isinstance(obj, torch.nn.Module):
        items.extend((f"{name}.{qual}", p) for qual, p in obj.named_parameters())
        items.extend((f"{name}.{qual}", b) for qual, b in obj.named_buffers())
    elif isinstance(obj, torch.optim.Optimizer):
        index = 0
        for g, group in enumerate(obj.param_groups):
            for p in group["params"]:
                key = params.get(id(p), str(index))
                for field, value in obj.state.get(p, {}).items():
                    _expand(f"{name}.state[{key}].{field}", value, items, problems, params)
                index += 1
            for field, value in group.items():
                if field != "params":
                    _expand(f"{name}.param_groups[{g}].{field}", value, items, problems, params)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _expand(f"{name}.{key}" if isinstance(key, str) and key.isidentifier() else f"{name}[{key!r}]",
                    value, items, problems, params)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _expand(f"{name}[{i}]", value, items, problems, params)
    elif obj is None or isinstance(obj, (bool, int, float, complex, str)):
        items.append((name, obj))
    else:
        problems.append(f"{name!r} is a {type(obj).__name__}: %ddp_diff compares modules, optimizers, "
                        "tensors, dicts and lists of them, and rng")


def _param_names(namespace: dict, names) -> dict[int, str]:
    """id(parameter) → its name in a module of the notebook's (the compared ones first), so an
    optimizer's state reads ``opt.state[model.fc.weight]`` rather than a number."""
    import torch

    found: dict[int, str] = {}
    first = [n for n in names if n in namespace]
    for key in first + [k for k in namespace if k not in first]:
        module = namespace[key]
        if isinstance(module, torch.nn.Module) and not key.startswith("_"):
            for qual, p in module.named_parameters():
                found.setdefault(id(p), f"{key}.{qual}")
    return found


def _rng_states() -> list[tuple[str, object]]:
    """The generators a cell draws from: torch's, Python's, numpy's (if imported), CUDA's (if used)."""
    import torch

    states: list[tuple[str, object]] = [("rng.torch", ("rng", torch.get_rng_state())),
                                        ("rng.python", ("rng", repr(random.getstate()).encode()))]
    if "numpy" in sys.modules:
        np_state = sys.modules["numpy"].random.get_state()
        states.append(("rng.numpy", ("rng", np_state[1].tobytes() + repr(np_state[2:]).encode())))
    if torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states.append((f"rng.cuda{i}", ("rng", state)))
    return states


def _entry(name: str, value) -> list:
    import torch

    if isinstance(value, tuple) and len(value) == 2 and value[0] == "rng":
        data = value[1]
        raw = data if isinstance(data, bytes) else _bytes(data)
        return [name, rankdiff.RNG, "state", [], hashlib.blake2b(raw, digest_size=16).hexdigest()]
    if isinstance(value, torch.Tensor):
        t = _local(value).detach()
        return [name, rankdiff.TENSOR, str(t.dtype).removeprefix("torch."), list(t.shape),
                hashlib.blake2b(_bytes(t), digest_size=16).hexdigest()]
    shown = repr(value)
    return [name, rankdiff.VALUE, type(value).__name__, [],
            hashlib.blake2b(shown.encode(), digest_size=16).hexdigest(), shown[:60]]


def _local(t):
    """A DTensor's local shard (what this rank holds); any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(t) -> memoryview:
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _max_abs_diff(mine, ref) -> float:
    """max |mine - ref| over every element, a chunk at a time (complex as its modulus)."""
    import torch

    a, b = mine.detach().cpu().reshape(-1), ref.reshape(-1)
    wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    top = 0.0
    for start in range(0, a.numel(), _CHUNK):
        part = (a[start:start + _CHUNK].to(wide) - b[start:start + _CHUNK].to(wide)).abs().max()
        top = max(top, float(part))
    return top


def _write(folder: str, name: str, data: dict) -> None:
    part = os.path.join(folder, name + ".part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.rename(part, os.path.join(folder, name))


def _wait_for(path: str, deadline: float) -> bool:
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _read(folder: str, name: str, deadline: float) -> dict | None:
    path = os.path.join(folder, name)
    if not _wait_for(path, deadline):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
