"""``--fake``'s arithmetic and words: the bytes a rank holds, the collectives of one step per kind
(count, buffer bytes, bytes a ring sends from each rank), the report each shown rank prints and
the one line that says nothing ran at that scale. Pure: the rank (nbddp/rank/fakeworld.py)
measures, this adds up and says it; tests check the sums by hand."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

# the collective kinds, by the c10d / functional op names torch dispatches
KINDS = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_":
    "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "allgather_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast", "broadcast": "broadcast", "scatter_": "scatter", "gather_": "gather",
    "reduce_": "reduce", "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all", "send": "send", "recv_": "recv", "barrier": "barrier",
}
LINE = "nothing ran at that scale"


def kind_of(op_name: str) -> str | None:
    """The collective an op is (``_allgather_base_`` → all_gather), None for any other op."""
    return KINDS.get(op_name)


def ring_sent(kind: str, nbytes: int, group: int) -> int:
    """Bytes one rank sends for a collective whose full buffer is ``nbytes`` in a group of
    ``group`` ranks, by the ring algorithm (NCCL's large-message choice): all-gather and
    reduce-scatter (g-1)/g of it, all-reduce twice that, all-to-all (g-1)/g, the rest all of it."""
    if group <= 1 or kind == "barrier":
        return 0
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return nbytes * (group - 1) // group
    if kind == "all_reduce":
        return 2 * nbytes * (group - 1) // group
    return nbytes


def step_of(steps: int) -> tuple[int | None, str]:
    """Which recorded phase is "a step" (phases count optimizer steps done), and what it is."""
    if steps >= 2:
        return steps - 1, f"step {steps} (the last optimizer step; {steps} ran)"
    if steps == 1:
        return 0, "the cell up to its one optimizer step (setup included)"
    return None, "the whole cell (no optimizer step ran)"


def per_kind(collectives: Iterable[Sequence[Any]], phase: int | None) -> dict[str, dict[str, int]]:
    """(kind, buffer bytes, group size, phase) records → per kind: count, bytes, sent (ring)."""
    out: dict[str, dict[str, int]] = {}
    for kind, nbytes, group, when in collectives:
        if phase is not None and when != phase:
            continue
        row = out.setdefault(kind, {"count": 0, "bytes": 0, "sent": 0})
        row["count"] += 1
        row["bytes"] += int(nbytes)
        row["sent"] += ring_sent(kind, int(nbytes), int(group))
    return dict(sorted(out.items()))


def human(nbytes: float) -> str:
    """Bytes as a person reads them, in binary units, three significant digits."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value >= 1000 else f"{value:.3g} {unit}"
    return f"{int(nbytes)} B"


def fake_line(ranks: Sequence[int], world_size: int, elapsed: float) -> str:
    """The launch's one line: which ranks ran of how many, and that nothing else did."""
    which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
    return (f"{which} of a {world_size}-rank fake world finished ok in {elapsed:.2f} s; {LINE}: no other "
            "rank ran and no collective moved data (torch's fake backend)")


KIND_WORDS = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Activation": "activations",
              "Temp": "temporaries", "Optstate": "optimizer state", "Other": "other"}  # MemTracker's kinds
NOT_COUNTED = "not the CUDA context, the allocator's caching and fragmentation, or NCCL's buffers"


def peak_line(data: dict[str, Any], phase: int | None, what: str) -> str:
    """The peak of the phase the collectives are counted for, by kind, or why it is not known."""
    peaks = data.get("peaks") or []
    peak = peaks[phase or 0] if len(peaks) > (phase or 0) else None
    if not peak:
        why = data.get("no_peak") or "torch's MemTracker saw no tensor in it"
        return f"  peak memory of {what}: not known ({why})"
    kinds = ", ".join(f"{KIND_WORDS.get(kind, kind)} {human(nbytes)}" for kind, nbytes in peak["by"].items() if nbytes)
    return (f"  peak memory of {what}: {human(peak['total'])} on {peak['device']} ({kinds}): this rank's tensors "
            f"as torch's MemTracker counts them, {NOT_COUNTED}")


def report_lines(data: dict[str, Any]) -> list[str]:
    """What one rank prints after its cell: bytes held, a step's collectives, what is unknown."""
    rank, world = data["rank"], data["world_size"]
    held = data["params"] + data["grads"] + data["optim"]
    lines = [f"nbddp --fake: rank {rank} of {world} ({LINE}; "
             "these are this rank's shapes, not timings)",
             f"  holds at the cell's end {human(held)}: parameters {human(data['params'])} "
             f"({data['numel']:,} elements), "
             f"gradients {human(data['grads'])}, optimizer state {human(data['optim'])}"]
    if not data.get("modules"):
        lines.append("  no nn.Module among the cell's global names: nothing held was counted")
    phase, what = step_of(data["steps"])
    rows = per_kind(data["collectives"], phase)
    if rows:
        lines.append(f"  collectives of {what}:")
        for kind, row in rows.items():
            lines.append(f"    {kind:<15}{row['count']:>5} x, {human(row['bytes']):>10} of buffers, "
                         f"{human(row['sent']):>10} sent by this rank (ring)")
    else:
        lines.append(f"  collectives of {what}: none")
    lines.append(peak_line(data, phase, what))
    lines += [f"  note: {note}" for note in data.get("notes", ())]
    return lines
