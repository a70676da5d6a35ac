"""Turning what ranks left behind (exit codes, signals, tracebacks, faulthandler stacks, stderr)
and what torchrun's agent (or srun) logged into one-line explanations. Pure text logic, so each
rule is unit-tested on its own."""
from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nbddp.core.states import RankState
from nbddp.core.summary import label

if TYPE_CHECKING:
    from nbddp.core.spec import LaunchSpec

Frame = tuple[str, int, str]  # (file, line, function) of faulthandler's dump


class RankLike(Protocol):
    """What the diagnosis reads and writes of a rank's result (nbddp/core/result.py's RankResult,
    named by its shape: result.py imports this module)."""

    rank: int
    state: RankState
    cause: str
    exception: dict[str, Any] | None
    blocked_at: str | None
    ended_at: float | None
    hint: str | None

    @property
    def ok(self) -> bool: ...

    def stderr_tail(self) -> str: ...


class RunLike(Protocol):
    """What the diagnosis reads of a launch's result (nbddp/core/result.py's RunResult)."""

    @property
    def ranks(self) -> Sequence[RankLike]: ...

    @property
    def script(self) -> str | None: ...

    @property
    def cell_file(self) -> str: ...

NOT_TARGETED = "not targeted by this cell"

_SIGNAL_WORDS = {
    signal.SIGSEGV: "crashed with SIGSEGV (segmentation fault)",
    signal.SIGABRT: "aborted (SIGABRT)",
    signal.SIGKILL: "killed by SIGKILL (from outside nbddp, or out of memory)",
    signal.SIGTERM: "terminated by SIGTERM from outside nbddp",
    signal.SIGBUS: "crashed with SIGBUS (bus error)",
    signal.SIGFPE: "crashed with SIGFPE (arithmetic error)",
    signal.SIGINT: "interrupted by SIGINT",
}


def describe_signal(number: int) -> str:
    try:
        sig = signal.Signals(number)
    except ValueError:
        return f"killed by signal {number}"
    return _SIGNAL_WORDS.get(sig, f"killed by {sig.name}")


CAUSE_LIMIT = 240


def describe_failure(exception: dict[str, Any] | None, code: int | None) -> str:
    if exception:
        where = f" at cell line {exception['cell_line']}" if exception.get("cell_line") else ""
        if exception.get("type") == "BdbQuit":  # `q` at the rank's debugger prompt
            return f"quit in the debugger{where}"
        message = exception.get("message") or ""
        first = condensed(message.strip().splitlines()[0]) if message.strip() else ""
        if len(first) > CAUSE_LIMIT:  # the whole message is in the traceback shown below
            first = first[:CAUSE_LIMIT - 1].rstrip() + "…"
        return f"{exception['type']}{': ' + first if first else ''}{where}"
    if code is None:
        return "ended without an exit code: the forkserver that reports it had ended, and the rank said none"
    return f"exited with code {code}"


# A C++ source location at the head of a native error ("[/__w/pytorch/pytorch/third_party/gloo/
# gloo/transport/tcp/pair.cc:553] "), the build machine's path of the file that raised it, and
# gloo's advice after the fact ("This is typically caused by a remote worker crashing. Check the
# logs of the remote worker before reporting an error. GLHF! 🏖️"), which the hint replaces.
_NATIVE_PATH = re.compile(r"\[(enforce fail at )?[^\]\s]*/([^/\]\s]+:\d+)\]")
_GLOO_ADVICE = re.compile(r"\.?\s*This is typically caused by .*$")


def condensed(line: str) -> str:
    """A native error's first line as a cause says it: the C++ file without its build path,
    without gloo's advice ("[pair.cc:553] Connection closed by peer [127.0.0.1]:53951");
    the whole message stays in the traceback."""
    return _GLOO_ADVICE.sub("", _NATIVE_PATH.sub(r"[\1\2]", line))


# ------------------------------------------------------------------ stacks
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')


def stack_complete(text: str) -> bool:
    return "most recent call first" in text and text.endswith("\n")


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """faulthandler's dump as a list of threads, each a list of (file, line, function),
    most recent call first."""
    threads: list[list[tuple[str, int, str]]] = []
    for raw in text.splitlines():
        if "most recent call first" in raw:
            threads.append([])
            continue
        match = _FRAME.match(raw)
        if match and threads:
            threads[-1].append((match["file"], int(match["line"]), match["func"].strip()))
    return threads


def blocked_at(stack_text: str, cell_path: str, source: str | None) -> str | None:
    """Where the rank's main code is: 'cell line 4: dist.all_reduce(t) (in all_reduce)'."""
    # The main thread first: faulthandler lists the newest thread first, and a thread the cell
    # started (its outermost frame threading's _bootstrap) is not where the rank is blocked.
    threads = sorted(parse_stacks(stack_text), key=_started_thread)
    for frames in threads:
        for index, (file, line, _func) in enumerate(frames):
            if file != cell_path:
                continue
            code = _source_line(source, line)
            inner = _innermost_library_call(frames[:index])
            text = f"cell line {line}"
            if code:
                text += f": {code}"
            if inner:
                text += f" (in {inner})"
            return text
    for frames in threads:  # no cell frame (a callable): the innermost frame of the main thread
        if frames:
            file, line, func = frames[0]
            return f"{func} ({os.path.basename(file)}:{line})"
    return None


def _started_thread(frames: list[Frame]) -> bool:
    return bool(frames) and frames[-1][2] == "_bootstrap" and frames[-1][0].endswith("threading.py")


def _innermost_library_call(frames: list[Frame]) -> str | None:
    """The call the cell line is waiting in, named as the user wrote it (all_reduce, barrier…)."""
    for _file, _line, func in reversed(frames):  # from the cell outward-in
        if func not in ("wrapper", "inner", "_fn", "decorate_context", "<lambda>"):
            return func
    return None


def _source_line(source: str | None, line: int) -> str:
    if not source:
        return ""
    lines = source.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


TIMEOUT_NOTE = "timed out after"   # how the timeout report starts (and the views and DDPTimeout find it)


def timeout_report(timeout_s: float, result: RunLike) -> str:
    text = f"{TIMEOUT_NOTE} {timeout_s:g} s. " + where_ranks_are(result)
    hint = split_ranks_hint(result)
    return f"{text} Hint: {hint}" if hint else text


def split_ranks_hint(result: RunLike) -> str | None:
    """When the ranks stopped in different places (some in a collective the others never
    reach), name the classic cause."""
    blocked = [r.blocked_at for r in result.ranks if r.blocked_at]
    lines = {at.split(":", 1)[0] for at in blocked}
    in_collective = any(_COLLECTIVE.search(at) for at in blocked)
    others = len(lines) > 1 or any(r.state == RankState.OK for r in result.ranks)
    if blocked and in_collective and others:
        return ("the ranks are not all in the same collective (a collective inside "
                "`if rank == ...:`, or a rank that took another branch); every rank must make the "
                "same collective calls in the same order.")
    return None


_COLLECTIVE = re.compile(r"\(in (all_reduce|all_gather\w*|reduce\w*|broadcast\w*|barrier|"
                         r"gather\w*|scatter\w*|all_to_all\w*|send|recv|wait|"
                         r"monitored_barrier|init_process_group|rendezvous)\)")


IDLE_WARNING = "warning: no output from any rank"   # how the views recognise the idle warning


def idle_report(idle_s: float, result: RunLike, live: Iterable[RankLike] | None,
                timeout: float | None = None) -> str:
    """The idle warning; with ``--timeout`` given it says when the cell will be stopped
    instead of suggesting the option (in words that stay true once the cell has ended: no
    countdown)."""
    if timeout is None:
        ending = "(use --timeout SECONDS to stop such a cell automatically)"
    else:
        ending = f"(--timeout {timeout:g} stops the cell {timeout:g} s after it started)"
    return (f"{IDLE_WARNING} for {idle_s:.0f} s and ranks still running; "
            f"a hung collective? {where_ranks_are(result, live)} "
            + (f"Hint: {split_ranks_hint(result)} " if split_ranks_hint(result) else "")
            + ending)


def is_hang_note(note: str) -> bool:
    """The idle warning or the timeout report: what a hang says (once, in the final report)."""
    return note.startswith(IDLE_WARNING) or note.startswith(TIMEOUT_NOTE)


def final_notes(notes: Iterable[str]) -> list[str]:
    """The notes a final report keeps: once the timeout report came (it says where each rank
    ended), an earlier idle warning saying much the same is history."""
    if any(n.startswith(TIMEOUT_NOTE) for n in notes):
        return [n for n in notes if not n.startswith(IDLE_WARNING)]
    return list(notes)


def where_ranks_are(result: RunLike, only: Iterable[RankLike] | None = None) -> str:
    """'rank 0 blocked at cell line 4: …; ranks 1–3 finished ok' for a timeout or idle report."""
    parts = []
    considered = only if only is not None else result.ranks
    for r in considered:
        if r.blocked_at:
            parts.append(f"rank {r.rank} blocked at {r.blocked_at}")
        elif r.state == RankState.STARTING:  # its launcher (torchrun, Ray, Slurm's queue) had not started it
            parts.append(f"rank {r.rank} not started yet")
        elif r.state != RankState.OK and r.ended_at is None:
            parts.append(f"rank {r.rank} still running (no stack)")
    finished = [r.rank for r in result.ranks if r.state == RankState.OK and r.cause != NOT_TARGETED]
    if finished:
        parts.append(label(finished) + " finished ok")
    idle = [r.rank for r in result.ranks if r.cause == NOT_TARGETED]
    if idle:
        parts.append(label(idle) + " not running this cell")
    return "; ".join(parts) + "." if parts else ""


# ------------------------------------------------------------------- hints
# A collective whose peer process ended under it (gloo's words, and the socket's).
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|connection reset|Broken pipe", re.I)
PEER_LOST_HINT = ("another rank ended (crashed, exited or simply finished) while this one waited in a "
                  "collective with it: every rank must make the same collective calls, in the same order and "
                  "with the same shapes (--env TORCH_DISTRIBUTED_DEBUG=DETAIL checks that); if a rank failed, "
                  "its error comes first.")

HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"environment variable (MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE) expected", re.I),
     "env:// reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the environment; a launcher "
     "(torchrun, or %%ddp) sets them. Run this under %%ddp, or set them yourself."),
    # a cell's own rendezvous (nbddp/rank/user_rendezvous.py names the cell line in the message)
    (re.compile(r"\) is held by another process on this machine"),
     "rank 0 hosts the rendezvous store on the port the cell chose, so it must be free: pick "
     "another, or drop the MASTER_ADDR/MASTER_PORT lines (%%ddp sets a free one)."),
    (re.compile(r"\) (is not an address of this machine|does not resolve)"),
     "every rank of %%ddp runs on this machine: use localhost, or drop the MASTER_ADDR/"
     "MASTER_PORT lines (%%ddp sets them)."),
    (re.compile(r"world_size=\d+ \(.*\) but this %%ddp launch has \d+ ranks"),
     "the group would wait for ranks that never come: pass the launch's size (or change -n), "
     "or leave rank= and world_size= out (%%ddp sets RANK and WORLD_SIZE)."),
    (re.compile(r"EADDRINUSE|address already in use", re.I),
     "the rendezvous port is held by another process: omit --master-port to get a free one, "
     "or end the job that holds it."),
    (re.compile(r"Default process group has not been initialized", re.I),
     "call dist.init_process_group(...) before any collective or get_rank()/get_world_size()."),
    # DDP(model) checks the count and shapes of the ranks' parameters (_verify_params_across_processes)
    (re.compile(r"DDP expects same model across all ranks|appears not to match (sizes|strides) of "
                r"the same param in process 0"),
     "the ranks built different models (a parameter's count or shape differs): %ddp_diff model on a "
     "pool, or --diff model on a cell that builds it without DDP, names which tensor differs on which rank."),
    (re.compile(r"Detected mismatch between collectives", re.I),
     "the ranks called different collectives (or with different shapes): the message names each "
     "rank's call; every rank must make the same collective calls in the same order."),
    (re.compile(r"mismatch between collectives|preamble\.length|"
                r"op\.preamble|Mismatch in (sizes|tensor)", re.I),
     "the ranks called different collectives (or with different shapes); rerun with "
     "--env TORCH_DISTRIBUTED_DEBUG=DETAIL to see which."),
    (re.compile(r"CUDA out of memory|OutOfMemoryError", re.I),
     "the GPU ran out of memory: lower the per-rank batch size, and make sure each rank uses its "
     "own device (torch.cuda.set_device(LOCAL_RANK))."),
    (re.compile(r"invalid device ordinal|Duplicate GPU detected|device not set", re.I),
     "each rank must use its own GPU: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) "
     "before creating tensors or the process group."),
    (re.compile(r"ncclInvalidUsage|NCCL error.*invalid usage", re.I),  # NCCL's reason not in the text
     "NCCL calls this invalid usage, most often two ranks on one GPU: each rank must use its own GPU "
     "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first); --env NCCL_DEBUG=WARN prints NCCL's reason."),
    # GPU code on a machine or a torch build without CUDA (the unchanged tutorials, on a laptop)
    (re.compile(r"has no attribute '_cuda_setDevice'"),
     "this torch is a CPU build, so torch.cuda.set_device(...) cannot run: on CPU drop the line "
     "(or put it under `if torch.cuda.is_available():`); gloo needs no device."),
    (re.compile(r"device_id \S+ does not match the current compilation's accelerator support|"
                r"device_id is an int, but no accelerator support|"
                r"device_id parameter must be an accelerator", re.I),
     "init_process_group(device_id=...) binds the group to a GPU, and this torch is a CPU build "
     "(or this machine has no GPU): drop device_id=... (gloo on CPU needs none)."),
    (re.compile(r"device_ids and output_device arguments only work with .*module parameters "
                r"\{device\(type='cpu'\)\}", re.I),
     "device_ids=[local_rank] is for a model on that GPU, and this one is on the CPU: on CPU "
     "give none, DDP(model)."),
    (re.compile(r"doesn't have NCCL built in|NCCL support is not compiled|"
                r"ProcessGroupNCCL is only supported with GPUs", re.I),
     "nccl needs CUDA GPUs, and this torch is a CPU build (or this machine has no GPU): use gloo, "
     "e.g. dist.init_process_group(nbddp.backend()), which picks nccl only where GPUs exist "
     "(%%ddp --backend auto)."),
    (re.compile(r"Torch not compiled with CUDA enabled|Cannot access accelerator device when "
                r"none is available|has no attribute '_cuda_", re.I),
     "this torch is a CPU build, so .cuda() / .to(local_rank) / device='cuda' cannot run: use "
     "`device = torch.device('cuda', local_rank) if torch.cuda.is_available() else "
     "torch.device('cpu')` and .to(device), or on CPU drop the .to(...)/.cuda()."),
    (re.compile(r"No CUDA GPUs are available|Found no NVIDIA driver|no CUDA-capable device", re.I),
     "this machine has no GPU, so .cuda() / .to(local_rank) / device='cuda' cannot run: use "
     "`device = torch.device('cuda', local_rank) if torch.cuda.is_available() else "
     "torch.device('cpu')` and .to(device), with the gloo backend."),
    (PEER_LOST, PEER_LOST_HINT),
    (re.compile(r"ranks have no stdin|EOF when reading a line"),
     "a rank has no stdin (the notebook cannot answer input() in four processes): define the "
     "value in the notebook and pass it with --push NAME, or read it from a file."),
    (re.compile(r"timed out.*(collective|wait|store)|Socket Timeout|Timed out waiting", re.I),
     "a rank never reached the matching collective (or rendezvous); check for collectives inside "
     "`if rank == 0:` and for ranks that exited early."),
]


def hint_for(text: str) -> str | None:
    """The first matching hint for an error message or the tail of a rank's stderr."""
    for pattern, hint in HINTS:
        if pattern.search(text or ""):
            return hint
    return None


# A rank that could not reach the network, where its kernel gave the ranks a private one.
_NO_NETWORK = re.compile(r"Network is unreachable|Temporary failure in name resolution|"
                         r"Name or service not known|No route to host|getaddrinfo failed|"
                         r"Failed to establish a new connection|URLError", re.I)
PRIVATE_NET_HINT = ("this kernel's ranks run in a private network (NBDDP_PRIVATE_NET; on a "
                    "JupyterHub server by default), which reaches no other machine: download in "
                    "the notebook first (ranks see the same files), or set NBDDP_PRIVATE_NET=0 "
                    "before %load_ext nbddp (other users of the server can then reach the store).")


_STOPPED = (RankState.TIMED_OUT, RankState.INTERRUPTED, RankState.TERMINATED)


def add_hints(result: RunLike, private_net: bool = False) -> None:
    """Give each rank that did not finish ok the matching one-line hint from HINTS, a rank
    that crashed (SIGSEGV…) the cell line faulthandler's crash report names, and a rank that
    exited non-zero without a traceback the last line it wrote to stderr as its cause.
    ``private_net``: the ranks ran in a private network, the first suspect for a network error."""
    for rank in result.ranks:
        if rank.ok or rank.hint:
            continue
        stderr = rank.stderr_tail()  # its tail only: a log may be huge
        if rank.state == RankState.KILLED and " at cell line " not in rank.cause:
            where = crash_line(stderr, result.script or result.cell_file, result.cell_file)
            if where:
                rank.cause += f" at {where}"
        if rank.state == RankState.FAILED and rank.exception is None and rank.cause.startswith("exited with code"):
            said = last_error_line(stderr)
            if said and said not in rank.cause:
                rank.cause += f": {said}"
        text = (rank.exception or {}).get("message", "") + "\n" + stderr
        hint = (PRIVATE_NET_HINT if private_net and _NO_NETWORK.search(text) else None) or hint_for(text)
        if rank.state in _STOPPED and hint == PEER_LOST_HINT:  # its peer's end was nbddp's stop, said already
            continue
        rank.hint = hint


_NOT_THE_CAUSE = re.compile(r"^\S+:\d+: \w*Warning: |"          # a warning the rank printed earlier
                            r"HYDRA_FULL_ERROR|^Try '.*--help' for help")  # advice after the error
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def last_error_line(stderr: str) -> str | None:
    """What a rank that exited by itself said last (hydra, argparse, click, a log line before
    ``sys.exit(1)``): the exception line of the last traceback in ``stderr``, else its last
    unindented line that does not introduce more (``Config search path:``) and is not a
    warning or advice (hydra's ``Set the environment variable HYDRA_FULL_ERROR=1 …``);
    shortened to ``CAUSE_LIMIT``."""
    lines = [_ESCAPES.sub("", line.rsplit("\r", 1)[-1]).rstrip() for line in stderr[-65536:].splitlines()]
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                default=None)
    if start is not None:
        said = next((line for line in lines[start + 1:] if line and not line[0].isspace()), None)
    else:
        said = next((line for line in reversed(lines) if line and not line[0].isspace()
                     and not line.endswith(":") and not _NOT_THE_CAUSE.search(line)), None)
    if not said:
        return None
    return said if len(said) <= CAUSE_LIMIT else said[:CAUSE_LIMIT - 1].rstrip() + "…"


def crash_line(stderr: str, script: str, source_file: str | None = None) -> str | None:
    """'cell line 4: ctypes.string_at(0)' from the last 'Fatal Python error' report in stderr
    (frames of ``script``; its source read from ``source_file``, the copy that outlives it)."""
    start = stderr.rfind("Fatal Python error")
    if start < 0:
        return None
    try:
        with open(source_file or script, encoding="utf-8") as f:
            source = f.read()
    except OSError:
        source = None
    where = blocked_at(stderr[start:], script, source)
    return where if where and where.startswith("cell line") else None


# ------------------------------------------------------ targeted pool cells
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "barrier",
    "monitored_barrier", "init_process_group", "new_group", "destroy_process_group",
    "DistributedDataParallel",
})


def collective_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call in ``source`` that every rank of the group must join."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in COLLECTIVES:
                found.append((node.lineno, name))
    return sorted(found)


def collective_warning(source: str, targets: Iterable[int], world_size: int) -> str | None:
    """A warning when a cell aimed at some ranks calls a collective the others will never join."""
    if len(set(targets)) >= world_size:
        return None
    calls = collective_calls(source)
    if not calls:
        return None
    others = sorted(set(range(world_size)) - set(targets))
    line, name = calls[0]
    return (f"warning: this cell runs on {label(set(targets))} only, but calls {name}() (cell line {line}), "
            f"a collective that {label(others)} will never join: it will hang "
            f"(give --timeout to have it stopped and diagnosed)")


# ------------------------------------------------------- torchrun's agent and srun
_AGENT_FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_AGENT_ERROR = re.compile(r"^[\w.]*(Error|Exception)\b|^torch\.distributed\.\S+(Error|Exception)")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_RDZV_TIMEOUT = ("RendezvousTimeoutError", "RendezvousClosedError")
SRUN_ERROR = "srun: error: "


def agent_failures(agent_log: str) -> list[tuple[int, int, int]]:
    """(rank, local rank, exit code) of each rank torchrun's failure summary names, its root
    cause (first observed failure) first. torchrun prints the root cause last, after the ranks
    it then stopped itself (SIGTERM), and those are only known for what they are once the
    failure before them is."""
    head, root_title, root = agent_log.rpartition(_ROOT_CAUSE)
    if not root_title:
        head, root = agent_log, ""
    found = _AGENT_FAILURE.findall(root) + _AGENT_FAILURE.findall(head)
    return [(int(a), int(b), int(c)) for a, b, c in found]


_CLOSING = re.compile(r"Sending process (\d+) closing signal (SIG[A-Z]+)")


def agent_closed(agent_log: str) -> set[int] | None:
    """The pids torchrun's agent signalled itself to stop them (its fail-fast after a rank
    failed, or the end of an attempt: "Sending process 6825 closing signal SIGTERM"), or None
    where its log says it stopped none: a rank that died by a signal and is not among them
    was not stopped by torchrun (killed by itself, from outside, or by the OOM killer)."""
    pids = {int(pid) for pid, _ in _CLOSING.findall(agent_log)}
    return pids or None


def agent_failure(agent_log: str, code: int, spec: LaunchSpec, log_path: str) -> str:
    """One line for torchrun's own failure (no rank's exception explains it): a rendezvous that
    timed out, else the last error line of its log."""
    if any(word in agent_log for word in _RDZV_TIMEOUT):
        waited = f" within {spec.rdzv_timeout:g} s" if spec.rdzv_timeout else ""
        where = spec.rdzv_endpoint or f"{spec.master_addr}:{spec.master_port}"
        return (f"rendezvous timed out: not all {spec.nnodes} nodes joined at {where}{waited} "
                f"(no rank starts until all have). Start torchrun (or %%ddp --launcher torchrun) on "
                f"the other node{'s' if spec.nnodes > 2 else ''} with the same --nnodes, "
                f"--rdzv-endpoint and --rdzv-id; torchrun's log: {log_path}")
    errors = [line.strip() for line in agent_log.splitlines()
              if _AGENT_ERROR.match(line.strip())
              or line.startswith(("usage:", "torchrun: error", "run.py: error"))]
    last = errors[-1] if errors else (agent_log.strip().splitlines() or [""])[-1]
    return f"torchrun exited with code {code}: {last[:300]} (torchrun's log: {log_path})"


def srun_errors(agent_lines: Iterable[str]) -> list[str]:
    """srun's own error lines (srun, not torchrun, is the agent of ``--launcher slurm``)."""
    return [line.strip() for line in agent_lines if line.startswith(SRUN_ERROR)]


def srun_failure(errors: list[str], code: int, log_path: str) -> str:
    """One line for srun's failure: its first error."""
    return f"srun exited with code {code}: {errors[0][len(SRUN_ERROR):][:300]} (srun's log: {log_path})"
