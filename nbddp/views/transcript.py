"""The static side of a launch's display: bounded per-rank tails and their text/plain and
text/html transcript (every rank's output and final status), which an executed notebook keeps
and GitHub, nbviewer and papermill show without any widget.

Pure: no IPython, no widgets, no processes. ``Collector`` is fed the launcher's events, each
rank stream through a terminal model (nbddp/views/terminal.py: a progress bar is one line, colours
are kept); ``bundle`` renders what it holds.
"""
from __future__ import annotations

import html
import time
from collections import deque

from nbddp.core import gpureport, summary
from nbddp.core.diagnosis import final_notes
from nbddp.core.result import KILLED, OK, RUNNING, STARTING, RunResult, signal_name
from nbddp.core.samelines import SameLines
from nbddp.core.states import CAUSING, FINAL_STATES, RankState
from nbddp.views import terminal
from nbddp.views.terminal import Terminal

MAX_LINE = terminal.MAX_LINE  # characters kept of one line (the rest is counted, not kept)
TAIL_LINES = 500         # lines kept per rank (the full log is on disk)
ALL_LINES = 1000         # lines kept in the interleaved "all ranks" view
MAX_DISPLAYS = 20        # rich outputs kept per rank
TRANSCRIPT_LINES = 200   # lines per rank in the saved transcript
SECTION_HEIGHT = "26em"  # a rank's section in the transcript scrolls past this (the live pane's height)
LIVE_LINES = 3           # last lines per rank in the live status's text
PROGRESS_CHARS = 48      # of a rank's progress line shown on its chip
CHIP_LIMIT = 8           # more ranks than this: same-state ranks share a chip after a failure
_CHIP_STYLE = ("display:inline-block;margin:1px 3px 1px 0;padding:0 6px;border-radius:9px;font:12px monospace;"
               "white-space:pre")
# between chips: copied text reads "rank 0: ok … · rank 1: …" (the chips' margins space them on screen)
CHIP_SEP = '<span class="nbddp-sep" style="font-size:0"> · </span>'



def themed(color: str, share: float = 0.6) -> str:
    """``color`` mixed with the theme's text colour (JupyterLab's --jp- variables; black where
    there are none, as on GitHub): darker on a light theme, lighter on a dark one, so text in
    it reads (>= 4.5:1) on either."""
    return f"color-mix(in srgb, {color} {share:.0%}, var(--jp-content-font-color0, #000))"


def tint(color: str, share: float = 0.14) -> str:
    """A background of ``color`` faintly over the theme's page colour (white without a theme)."""
    return f"color-mix(in srgb, {color} {share:.0%}, var(--jp-layout-color0, #fff))"


# chip colours per state: (foreground, background), from one hue each, fitted to the theme
_HUES = {
    RankState.STARTING: "#555", RankState.RUNNING: "#0b5394", RankState.OK: "#1e6b2e",
    RankState.FAILED: "#a31515", RankState.TIMED_OUT: "#8a4b00", RankState.KILLED: "#a31515",
    RankState.TERMINATED: "#666", RankState.INTERRUPTED: "#8a4b00",
    "hung": "#8a5a00",  # not a state: a running rank the idle warning found waiting
}
STATE_COLORS = {state: (themed(hue), tint(hue)) for state, hue in _HUES.items()}
ERROR_TEXT = themed("#c62828")     # a cause, in any theme
WARN_TEXT = themed("#8a4b00")      # nbddp's notes
MUTED = "var(--jp-content-font-color2, #666)"
# JupyterLab's own stderr background (light pink / dark red), the text in the theme's colour
STDERR_STYLE = "background:var(--jp-rendermime-error-background, #fdd)"
# a <pre> in nbconvert's HTML otherwise takes the page's proportional font
# (and JupyterLab's output CSS breaks a <pre>'s long lines anywhere, "d|ist.barrier()": at spaces here)
PRE_STYLE = ("margin:0;font-family:monospace,monospace;font-size:12px;white-space:pre-wrap;"
             "word-break:normal;overflow-wrap:anywhere")


class Tail:
    """The last ``size`` lines of one rank (stdout and stderr in arrival order)."""

    def __init__(self, size: int = TAIL_LINES):
        self.lines: deque = deque(maxlen=size)   # (stream, text)
        self.total = 0
        self.displays: deque = deque(maxlen=MAX_DISPLAYS)
        self.display_total = 0

    @property
    def hidden(self) -> int:
        return self.total - len(self.lines)

    def add(self, stream: str, lines: list[str]) -> None:
        self.total += len(lines)
        if len(lines) >= self.lines.maxlen:
            lines = lines[-self.lines.maxlen:]
        self.lines.extend((stream, line) for line in lines)


class Collector:
    """Keeps what the views and the transcript need: per-rank tails of the shown ranks, the
    interleaved tail, rich outputs, notes, and the RunResult the launcher updates."""

    def __init__(self, spec, tail_lines: int = TAIL_LINES, all_lines: int = ALL_LINES):
        self.spec = spec
        self.result: RunResult | None = None
        self.backend: str | None = None
        self.tails: dict[int, Tail] = {r: Tail(tail_lines) for r in range(spec.world_size) if spec.shown(r)}
        self.all = Tail(all_lines)       # entries: (stream, (rank, text)); rank a tuple: ranks that printed it
        shown = sorted(self.tails)
        self.merge = len(shown) > 1 and getattr(spec, "same_lines", "apart") == "merge"
        self._same = SameLines(shown) if self.merge else None   # --same-lines merge: the all-ranks lines
        self.notes: list[str] = []
        self._terms: dict[tuple[int, str], Terminal] = {}
        self.finished = False

    def launch_started(self, result, spec, backend):
        self.result, self.backend = result, backend

    def output(self, rank: int, stream: str, data: bytes) -> list[str]:
        """Returns the complete lines this chunk finished (empty for a hidden rank); the line
        still being written is ``pending(rank)``."""
        if rank not in self.tails:
            return []
        term = self._terms.get((rank, stream))
        if term is None:
            term = self._terms[(rank, stream)] = Terminal()
        lines = term.feed(data)
        if lines:
            self._add(rank, stream, lines)
        return lines

    def _add(self, rank, stream, lines):
        self.tails[rank].add(stream, lines)
        if self._same is None:
            self._add_all([((rank,), (stream, line)) for line in lines[-self.all.lines.maxlen:]], len(lines))
            return
        now = time.monotonic()
        out = []
        for line in lines:
            out += self._same.add(rank, (stream, line), now)
        self._add_all(out)

    def _add_all(self, entries, total=None):
        """(ranks, (stream, line)) entries into the interleaved tail."""
        self.all.total += len(entries) if total is None else total
        self.all.lines.extend((stream, (ranks[0] if len(ranks) == 1 else ranks, line))
                              for ranks, (stream, line) in entries)

    def tick(self, now: float | None = None) -> bool:
        """Lines held to be said once for several ranks that may go out now; True if any did."""
        if self._same is None:
            return False
        out = self._same.due(time.monotonic() if now is None else now)
        self._add_all(out)
        return bool(out)

    def pending(self, rank: int) -> list[tuple[str, str]]:
        """(stream, line) for each of the rank's streams with a line not ended yet (a progress bar)."""
        out = []
        for stream in ("stdout", "stderr"):
            term = self._terms.get((rank, stream))
            if term is not None and term.has_pending:
                out.append((stream, term.pending))
        return out

    def progress(self, rank: int) -> str:
        """The rank's latest progress line (last rewritten by \\r), plain text, '' if none."""
        found = [t.progress for s in ("stderr", "stdout") if (t := self._terms.get((rank, s))) is not None]
        return next((p for p in found if p), "")

    def display(self, rank: int, bundle: dict) -> bool:
        tail = self.tails.get(rank)
        if tail is None:
            return False
        tail.displays.append((tail.total, bundle))   # after this many lines: shown in that order
        tail.display_total += 1
        return True

    def note(self, text: str):
        self.notes.append(text)

    def rank_exited(self, rank_result):
        for stream in ("stdout", "stderr"):
            term = self._terms.get((rank_result.rank, stream))
            if term is not None:
                rest = term.flush()
                if rest:
                    self._add(rank_result.rank, stream, rest)
        if self._same is not None:
            self._add_all(self._same.ended(rank_result.rank, time.monotonic()))

    def launch_finished(self, result):
        self.result = result
        for (rank, stream), term in self._terms.items():
            rest = term.flush()
            if rest:
                self._add(rank, stream, rest)
        if self._same is not None:
            self._add_all(self._same.flush())
        self.finished = True


# ------------------------------------------------------------------ rendering
def elapsed_of(rank_result, now: float | None = None) -> float | None:
    if rank_result.started_at is None:
        return None
    end = rank_result.ended_at or (now if now is not None else time.time())
    return max(0.0, end - rank_result.started_at)


def status_words(rank_result, now: float | None = None) -> str:
    """'ok 1.2 s exit 0' — the chip's text after the rank's name."""
    parts = [rank_result.state]
    elapsed = elapsed_of(rank_result, now)
    if elapsed is not None:
        parts.append(f"{elapsed:.1f} s")
    code = rank_result.exitcode
    if code is not None and code >= 0:
        parts.append(f"exit {code}")
    elif code is not None:   # a signal by its name, not "exit -9" / "exit -15"
        if rank_result.state != KILLED:
            parts[-1] += "," if len(parts) > 1 else ""
        parts.append(signal_words(rank_result.state, code))
    return " ".join(parts)


def signal_words(state: str, code: int) -> str:
    """How a rank ended by a signal reads after its state: 'killed (SIGKILL)' needs only the
    name, any other state says it was stopped: 'terminated, stopped (SIGTERM)'."""
    return f"({signal_name(-code)})" if state == KILLED else f"stopped ({signal_name(-code)})"


def launch_line(result, spec, backend: str, times: str = "×") -> str:
    """The launch's shape, backend and meeting point: the first thing both views show."""
    n = result.world_size
    shape = f"{spec.nnodes} node{'s' if spec.nnodes > 1 else ''} {times} {spec.nproc_per_node}"
    if spec.launcher == "torchrun":
        if spec.rdzv_endpoint:
            where = f"torchrun, {spec.rdzv_backend} rendezvous at {spec.rdzv_endpoint}"
        elif spec.master_port is not None:
            where = f"torchrun, master {spec.master_addr}:{spec.master_port}"
        else:
            where = "torchrun --standalone"
    elif spec.launcher == "slurm":
        where = "Slurm: srun + torchrun per node, c10d rendezvous on the first node"
    elif spec.launcher == "ray":  # the first node (and its port) is known once Ray has placed it
        where = "Ray: one torchrun per node from a placement group, c10d rendezvous on the first node"
    else:
        where = f"MASTER_PORT {result.master_port}"
    if spec.fake:
        ran = ",".join(map(str, spec.ranks_run))
        return (f"rank{'s' if len(spec.ranks_run) > 1 else ''} {ran} of {n} ({shape}) on torch's fake "
                "backend (the cell's process groups are redirected to it): no other rank runs")
    return f"{n} rank{'s' if n > 1 else ''} ({shape}), backend {backend}, {where}"


def _elsewhere(result) -> str:
    """Where the ranks this machine did not run are: other nodes, or (--fake) nowhere."""
    if result.fake:
        return "not run (--fake runs only the ranks it names: nothing ran at that scale)"
    return "on other nodes (their output is shown there)"


def headline(result, finished: bool = True) -> str:
    n = result.world_size
    word = f"{n} rank{'s' if n != 1 else ''}"
    if result.fake:
        ran = [r.rank for r in result.ranks]
        word = f"rank{'s' if len(ran) > 1 else ''} {','.join(map(str, ran))} of a {n}-rank fake world"
    elif result.remote:
        here = len([r for r in result.ranks if r.rank >= 0])
        word += f" ({here} on this node)"
    if not finished:
        return f"nbddp: {word} running"
    if result.ok:
        return f"nbddp: {word}, all ok in {result.elapsed:.2f} s"
    bad = [r for r in result.ranks if r.state != OK]
    states = sorted({r.state for r in bad})
    return f"nbddp: {word}, {len(bad)} not ok ({', '.join(states)}) after {result.elapsed:.2f} s"


def _hidden_note(tail: Tail, shown: int, log_hint: str) -> str:
    hidden = tail.total - shown
    return f"… {hidden} earlier line{'s' if hidden != 1 else ''} hidden{log_hint}"


def log_path(result, rank: int) -> str:
    """Where rank ``rank``'s full stdout is kept (the launch's folder if it has none)."""
    res = result.rank(rank)
    return (res.stdout_path if res is not None else None) or result.log_dir


def _local_tails(collector: Collector):
    """The shown ranks that ran here: a rank of another node (torchrun, multi-node) is left out."""
    result = collector.result
    return [(rank, tail) for rank, tail in collector.tails.items()
            if result.rank(rank) is not None or tail.total or tail.display_total]


def _silent(collector: Collector) -> list:
    """Many ranks and a failure: the ranks that wrote nothing get no section of their own."""
    if not _folded(collector.result):
        return []
    return [rank for rank, tail in _local_tails(collector) if not tail.total and not tail.display_total]


def _silent_lines(collector: Collector) -> list[str]:
    silent = set(_silent(collector))
    groups = summary.groups([r for r in collector.result.ranks if r.rank in silent])
    return [f"{summary.label(ranks)}: {state}, no output" for ranks, state, _ in groups]


def _sections(collector: Collector):
    silent = set(_silent(collector))
    return [(rank, tail) for rank, tail in _local_tails(collector) if rank not in silent]


def _same_sections(collector: Collector):
    """(ranks, tail) per section: with --same-lines merge, ranks whose output is the same line for
    line (and that ended in the same state) share one section; ranks that differ keep their own."""
    sections = _sections(collector)
    if not collector.merge:
        return [([rank], tail) for rank, tail in sections]
    groups: dict = {}
    for rank, tail in sections:
        res = collector.result.rank(rank)
        key = (tuple(tail.lines), tail.total, res.state if res is not None else None) \
            if not tail.display_total else ("apart", rank)
        groups.setdefault(key, []).append((rank, tail))
    return [([rank for rank, _ in members], members[0][1]) for members in groups.values()]


def _section_name(collector: Collector, ranks: list, tail: Tail) -> tuple[str, str]:
    """What a section is called and where its full log is: a rank's own, or the launch's folder
    for ranks that printed the same."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}", log_path(collector.result, ranks[0])
    same = ", the same on each" if tail.total else ""
    return f"{summary.label(ranks)}{same}", collector.result.log_dir


def logs_kept(collector: Collector) -> str:
    """What a saved transcript says after the log folder: whether it outlives the kernel."""
    if collector.spec.log_dir:
        return ""
    return " (removed when the kernel stops; --log-dir DIR keeps them)"


def live_text(collector: Collector, hung=()) -> str:
    """The live view's state in text: what a notebook saved while the cell runs keeps (a
    widget's view is gone once its kernel is): each rank's state and its last lines."""
    result = collector.result
    out = [headline(result, collector.finished) + " (the last state the live view showed)",
           f"logs: {result.log_dir}{logs_kept(collector)}"]
    for r in result.ranks:
        words = "hung, " + status_words(r) if r.rank in hung else status_words(r)
        out.append(f"  rank {r.rank}: {words}" + (f" — {r.cause}" if r.cause else ""))
    for rank, tail in _local_tails(collector):
        lines = [("stderr| " if s == "stderr" else "") + terminal.plain(t) for s, t in list(tail.lines)[-LIVE_LINES:]]
        lines += [("stderr| " if s == "stderr" else "") + terminal.plain(t) for s, t in collector.pending(rank)]
        if lines:
            out.append(f"--- rank {rank}: last of {tail.total} line{'s' if tail.total != 1 else ''} ---")
            out += lines
    return "\n".join(out) + "\n"


def render_text(collector: Collector, lines_per_rank: int = TRANSCRIPT_LINES, streamed: bool = False) -> str:
    """``streamed``: text mode showed every line and note above, so the ranks' lines are not said
    again here (a saved notebook carries each line once): the status alone."""
    result = collector.result
    out = [headline(result, collector.finished), f"logs: {result.log_dir}{logs_kept(collector)}"]
    if _folded(result):
        out += ["  " + line for line in summary.state_lines(result.ranks, include_ok=True)]
    else:
        for r in result.ranks:
            line = f"  rank {r.rank}: {status_words(r)}"
            if r.cause:
                line += f" — {r.cause}"
            out.append(line)
    out += [summary.wrapped(line) for line in gpureport.lines(result.ranks)]
    for note in ([] if streamed else final_notes(collector.notes)):   # text mode streamed each note
        out.append(summary.wrapped(f"note: {note}"))
    if result.remote:
        out.append(f"  {summary.label(result.remote)}: {_elsewhere(result)}")
    out += _silent_lines(collector)
    for ranks, tail in ([] if streamed else _same_sections(collector)):
        name, log = _section_name(collector, ranks, tail)
        lines = list(tail.lines)[-lines_per_rank:]
        out.append(f"--- {name} ({tail.total} line{'s' if tail.total != 1 else ''}) ---")
        if tail.total > len(lines):
            out.append(_hidden_note(tail, len(lines), f" (full log: {log})"))
        for stream, text in lines:
            out.append(("stderr| " if stream == "stderr" else "") + terminal.plain(text))
        if tail.display_total:
            out.append(f"[{tail.display_total} rich output{'s' if tail.display_total != 1 else ''}]")
    return "\n".join(out) + "\n"


def _folded(result) -> bool:
    """Many ranks and a failure: same-state ranks are said once (chips, status lines)."""
    return len(result.ranks) > CHIP_LIMIT and any(r.state in CAUSING for r in result.ranks)


def chip_html(rank_result, now: float | None = None, progress: str = "", hung: bool = False) -> str:
    """One rank's status chip; ``progress`` (its latest progress-bar line) shown small inside;
    ``hung``: amber, with where the rank waits (while the idle warning holds)."""
    fg, bg = STATE_COLORS["hung"] if hung else STATE_COLORS.get(rank_result.state, STATE_COLORS[RankState.STARTING])
    extra = ""
    if hung and rank_result.blocked_at:
        progress = f"waiting at {rank_result.blocked_at}"
    if progress:
        short = progress.strip()
        short = short if len(short) <= PROGRESS_CHARS else short[:PROGRESS_CHARS - 1] + "…"
        extra = f' <span class="nbddp-progress" style="opacity:.8">{html.escape(short)}</span>'
    title = html.escape(rank_result.cause or rank_result.state, quote=True)
    state_class = "hung" if hung else rank_result.state.replace(" ", "-")
    return (f'<span class="nbddp-chip nbddp-{state_class}" title="{title}" '
            f'style="{_CHIP_STYLE};color:{fg};background:{bg};border:1px solid {bg}">'
            f'rank {rank_result.rank}: {html.escape(status_words(rank_result, now))}{extra}</span>')


def chips_html(result, now: float | None = None, progress=None, hung=()) -> str:
    """``progress``: rank → its progress line (a Collector's ``progress``), or None; ``hung``:
    the ranks the idle warning found waiting. Above CHIP_LIMIT ranks, once some rank failed,
    the ranks in the same final state share one chip."""
    if not _folded(result):
        return CHIP_SEP.join(chip_html(r, now, progress(r.rank) if progress else "", r.rank in hung)
                             for r in result.ranks)
    out = []
    for ranks, state, cause in sorted(summary.groups(result.ranks), key=lambda g: g[1] not in CAUSING):
        if len(ranks) == 1:
            out.append(chip_html(result.rank(ranks[0]), now, progress(ranks[0]) if progress else ""))
            continue
        fg, bg = STATE_COLORS.get(state, STATE_COLORS[RankState.STARTING])
        codes = {result.rank(r).exitcode for r in ranks}
        code = codes.pop() if len(codes) == 1 else None
        ended = ""   # the signal that ended them all, as a single chip says it
        if code is not None and code < 0:
            ended = (" " if state == KILLED else ", ") + signal_words(state, code)
        out.append(f'<span class="nbddp-chip nbddp-group nbddp-{state.replace(" ", "-")}" '
                   f'title="{html.escape(cause or state, quote=True)}" style="{_CHIP_STYLE};color:{fg};'
                   f'background:{bg};border:1px solid {bg}">{html.escape(summary.label(ranks))}: '
                   f'{html.escape(state + (f" ({cause})" if cause else "") + ended)}</span>')
    return CHIP_SEP.join(out)


def lines_html(entries, with_rank: bool = False) -> str:
    """``<pre>`` body for (stream, text) or (stream, (rank, text)) entries; stderr highlighted."""
    parts = []
    for stream, item in entries:
        if with_rank:
            rank, text = item
            if isinstance(rank, str):   # nbddp's own notes in the interleaved view
                parts.append(f'<span class="nbddp-stderr" style="{STDERR_STYLE}">[{html.escape(rank)}]: '
                             f'{html.escape(text)}</span>')
                continue
            # a tuple: ranks that printed the same line, said once (--same-lines merge)
            who = summary.label(rank) if isinstance(rank, tuple) else f"rank{rank}"
            text = f"[{who}]: " + terminal.to_html(text)
        else:
            text = terminal.to_html(item)
        if stream == "stderr":
            parts.append(f'<span class="nbddp-stderr" style="{STDERR_STYLE}">{text}</span>')
        else:
            parts.append(text)
    return "\n".join(parts)


def _display_html(bundle: dict) -> str:
    if "image/png" in bundle:
        return f'<img src="data:image/png;base64,{bundle["image/png"]}"/>'
    if "image/jpeg" in bundle:
        return f'<img src="data:image/jpeg;base64,{bundle["image/jpeg"]}"/>'
    if "text/html" in bundle:
        return str(bundle["text/html"])
    if "image/svg+xml" in bundle:
        return str(bundle["image/svg+xml"])
    return f"<pre>{html.escape(str(bundle.get('text/plain', '')))}</pre>"


def render_html(collector: Collector, lines_per_rank: int = TRANSCRIPT_LINES, streamed: bool = False) -> str:
    """``streamed``: text mode showed every line, rich output and note above, so the status
    alone (a saved notebook carries each line once)."""
    result = collector.result
    out = ['<div class="nbddp-transcript">',
           f'<div><b>{html.escape(headline(result, collector.finished))}</b> '
           f'<span style="color:{MUTED}">logs: <code>{html.escape(result.log_dir)}</code>'
           f'{html.escape(logs_kept(collector))}</span></div>',
           f'<div>{chips_html(result, progress=collector.progress)}</div>']
    folded = _folded(result)   # then the chips already say the other groups
    for ranks, state, cause in summary.groups(result.ranks):
        if cause and (not folded or state in CAUSING):
            out.append(f'<div class="nbddp-cause" style="color:{ERROR_TEXT}">{html.escape(summary.label(ranks))}: '
                       f'{html.escape(cause)}</div>')
    gpu = gpureport.lines(result.ranks)
    if gpu:  # the figures muted, a note on a shared GPU as nbddp's other notes
        figures, notes = [x for x in gpu if not x.startswith("note:")], [x for x in gpu if x.startswith("note:")]
        shown = html.escape("\n".join(figures))
        out.append(f'<pre class="nbddp-gpu" style="{PRE_STYLE};color:{MUTED}">{shown}</pre>')
        out += [f'<pre style="{PRE_STYLE};color:{WARN_TEXT}">{html.escape(n)}</pre>' for n in notes]
    for note in () if streamed else final_notes(collector.notes):
        out.append(f'<pre style="{PRE_STYLE};color:{WARN_TEXT}">{html.escape(note)}</pre>')
    if result.remote:
        out.append(f'<div style="color:{MUTED}">{summary.label(result.remote)}: '
                   f'{html.escape(_elsewhere(result))}</div>')
    failed = {r.rank for r in result.ranks if r.state in CAUSING}
    for line in _silent_lines(collector):
        out.append(f'<div style="color:{MUTED}">{html.escape(line)}</div>')
    sections = [] if streamed else _same_sections(collector)
    # about as tall as the live view was: the failed ranks open (else the first, as the live
    # view showed it), the rest folded, each scrolled within SECTION_HEIGHT, its end in view
    opened = failed or (set(sections[0][0]) if sections else set())
    for ranks, tail in sections:
        rank, (name, log) = ranks[0], _section_name(collector, ranks, tail)
        lines = list(tail.lines)[-lines_per_rank:]
        is_open = bool(opened & set(ranks))
        words = status_words(result.rank(rank)) if len(ranks) == 1 else str(getattr(result.rank(rank), "state", ""))
        out.append(f'<details{" open" if is_open else ""}><summary>{html.escape(name)} — {html.escape(words)}'
                   f' ({tail.total} line{"s" if tail.total != 1 else ""})</summary>')
        out.append(f'<div class="nbddp-section" style="max-height:{SECTION_HEIGHT};overflow:auto;display:flex;'
                   f'flex-direction:column-reverse"><div>')
        if tail.total > len(lines):
            out.append(f'<div style="color:{MUTED}"><i>{html.escape(_hidden_note(tail, len(lines), ""))}'
                       f' (full log: <code>{html.escape(log)}</code>)'
                       f'</i></div>')
        first = tail.total - len(lines)          # the number of the first line shown
        at = 0
        for after, bundle in tail.displays:
            cut = min(max(after - first, at), len(lines))   # rich output after line `after`, in order
            if cut > at:
                out.append(f'<pre style="{PRE_STYLE}">{lines_html(lines[at:cut])}</pre>')
                at = cut
            out.append(f'<div class="nbddp-display">{_display_html(bundle)}</div>')
        if at < len(lines) or not lines:
            out.append(f'<pre style="{PRE_STYLE}">{lines_html(lines[at:])}</pre>')
        out.append('</div></div></details>')
    out.append('</div>')
    return "\n".join(out)


def bundle(collector: Collector, streamed: bool = False) -> dict:
    """The static transcript as a mime bundle: text/plain and text/html. ``streamed``: text mode
    already streamed every line, rich output and note above, so both say the status alone."""
    return {"text/plain": render_text(collector, streamed=streamed),
            "text/html": render_html(collector, streamed=streamed)}


__all__ = ["Tail", "Collector", "bundle", "render_text", "render_html", "chips_html",
           "status_words", "headline", "FINAL_STATES", "RUNNING", "STARTING"]
