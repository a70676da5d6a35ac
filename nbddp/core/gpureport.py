"""The words for what each rank's CUDA devices held (nbddp/rank/gpumemory.py measures it when a
cell ends): torch's peak allocated and what was still held, per rank and device, and one note
where two ranks of a node allocated on the same GPU, the classic "every rank on GPU 0" of a
missing ``torch.cuda.set_device(LOCAL_RANK)``. Pure, so every line is tested on CPU."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from nbddp.core.fakereport import human
from nbddp.core.summary import label, ranges

FOLD_ABOVE = 4  # more ranks than this with GPU memory: one line for all of them


class RankLike(Protocol):
    @property
    def rank(self) -> int: ...
    @property
    def node_rank(self) -> int: ...
    @property
    def gpu_memory(self) -> Sequence[dict[str, Any]] | None: ...


def gpu_name(visible: Any) -> str:
    """A device as CUDA_VISIBLE_DEVICES names it: ``GPU 3``, or a UUID as it is (``GPU-5d3c…``, ``MIG-…``)."""
    text = str(visible)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU {text}"


def device_name(entry: dict[str, Any]) -> str:
    """``cuda:0``, or ``cuda:0 (GPU 3)`` where CUDA_VISIBLE_DEVICES renumbered it."""
    name = f"cuda:{entry['device']}"
    return name if str(entry["visible"]) == str(entry["device"]) else f"{name} ({gpu_name(entry['visible'])})"


def _rank_line(rank: int, entries: Sequence[dict[str, Any]]) -> str:
    parts = [f"{device_name(e)} peak {human(e['peak'])}, {human(e['allocated'])} held at the end"
             for e in entries]
    return f"rank {rank}: " + "; ".join(parts)


def lines(ranks: Iterable[RankLike]) -> list[str]:
    """The report's GPU lines: nothing where no rank used CUDA."""
    used = [(r.rank, r.node_rank, list(r.gpu_memory)) for r in ranks if r.gpu_memory]
    if not used:
        return []
    head = "GPU memory (torch's peak allocated; the CUDA context and allocator cache come on top):"
    if len(used) <= FOLD_ABOVE:
        out = [head] + ["  " + _rank_line(rank, entries) for rank, _, entries in used]
    else:
        peaks = {rank: max(e["peak"] for e in entries) for rank, _, entries in used}
        top = max(peaks, key=lambda r: peaks[r])
        top_entries = next(entries for rank, _, entries in used if rank == top)
        out = [head, f"  {label(sorted(peaks))}: peak {human(min(peaks.values()))} to {human(peaks[top])} each",
               "  the most: " + _rank_line(top, top_entries)]
    return out + shared_notes(used)


def shared_notes(used: Sequence[tuple[int, int, Sequence[dict[str, Any]]]]) -> list[str]:
    """One note per GPU that several ranks of one node allocated on, where the node has a GPU
    for each of its ranks (with fewer, nbddp's placement already said they share)."""
    on: dict[tuple[int, str], list[int]] = defaultdict(list)
    ranks_of_node: dict[int, int] = defaultdict(int)
    devices_seen: dict[int, int] = defaultdict(int)
    for rank, node, entries in used:
        ranks_of_node[node] += 1
        devices_seen[node] = max(devices_seen[node], max(e.get("count", 0) for e in entries))
        for e in entries:
            on[(node, str(e["visible"]))].append(rank)
    notes = []
    for (node, visible), ranks in sorted(on.items()):
        if len(ranks) > 1 and devices_seen[node] >= ranks_of_node[node]:
            notes.append(f"note: ranks {ranges(ranks)} all allocated on {gpu_name(visible)}"
                         f"{f' of node {node}' if node else ''}: each rank should run on its own, "
                         "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before anything touches CUDA")
    return notes
