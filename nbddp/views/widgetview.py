"""Live ipywidgets view of a launch: a header with one status chip per rank, one pane per rank
(its stdout and stderr, stderr highlighted, and its rich output), and an "all ranks" pane with
lines interleaved in arrival order. Up to 8 shown ranks get tabs; more get a selector.

The view is displayed under a display_id while the launch runs; when it ends, that output is
replaced (update_display) by the static text/plain + text/html transcript (nbddp/views/transcript.py)
and every widget of the view is closed: a saved notebook reads the same after a kernel restart,
on GitHub and in nbconvert, and the kernel keeps no widgets from past cells.

Each rank stream goes through a terminal model (nbddp/views/terminal.py): a line still being written
(a progress bar) is shown at the bottom of its pane, updated at the pane's rate, and mirrored on
the rank's chip.

Bounded: each pane holds the last TAIL_LINES lines (with an "N earlier lines hidden" marker and
the full log's path); widget updates are sent from ``tick`` only, at most every PANE_INTERVAL_S
per pane and within a token-bucket budget of RATE_CHARS_PER_S, so a flood of long lines costs
the front end about 1 MB of HTML a second, whatever the ranks produce.
"""
from __future__ import annotations

import html
import itertools
import time

import ipywidgets as W
from ipywidgets.widgets.widget_string import HTMLStyle
from IPython.display import display as ipy_display

from nbddp.core.sink import Sink
from nbddp.views import transcript
from nbddp.core.diagnosis import IDLE_WARNING
from nbddp.core.result import OK, RUNNING, STARTING
from nbddp.core import summary
from nbddp.core.summary import CAUSING, label
from nbddp.views.textview import KERNEL_WINDOW, REPORT_WAIT_S
from nbddp.views.transcript import Collector

TAB_LIMIT = 8            # more shown ranks than this: a dropdown instead of a tab strip
PANE_INTERVAL_S = 0.25   # a pane is re-sent at most 4 times a second
HEADER_INTERVAL_S = 0.5
RATE_CHARS_PER_S = 1_000_000  # pane HTML sent to the front end per second, on average, at most
BURST_CHARS = 1_000_000       # what may go out at once after a quiet spell
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

SLACK_LINES = 250        # a pane holds up to TAIL_LINES + this before it is compacted
MAX_BLOCKS = 120         # blocks in a pane before it is compacted


class _Pane:
    """One rank's (or all ranks') scrolling pane. Lines are appended in blocks: each push adds
    one HTML widget with the lines that came since the last one, and only the small "pending"
    widget (lines still being written) is re-sent; nothing shown is replaced, so a selection
    survives and the scroller, created once, keeps its position (column-reverse: pinned to the
    newest line while the user is at the bottom, left alone when they scrolled up). A rank's rich
    output is a block of its own, in order with its lines. Bounded: past TAIL_LINES + SLACK_LINES
    lines (or MAX_BLOCKS blocks) the pane is compacted to its last TAIL_LINES lines, once.
    """

    def __init__(self, title: str, shared: dict):
        self.title = title
        self.shared = shared
        self.marker = W.HTML(value="", **shared)
        self.pending = W.HTML(value="", **shared)
        self.blocks: list = []        # (widget, lines in it)
        self.shown = 0                # lines in the blocks
        self.sent = 0                 # the tail's total when the last block was made
        # flex:none — a box shrinks to its scroller's height (and scrolls itself) otherwise
        self.inner = W.VBox([self.marker, self.pending], layout=W.Layout(flex="none", overflow="visible"))
        self.box = W.VBox([self.inner], layout=W.Layout(
            max_height="26em", overflow="auto", display="flex", flex_flow="column-reverse",
            border="1px solid #ddd", padding="2px 6px"))
        self.box.add_class("nbddp-pane")
        self.widgets = [self.marker, self.pending, self.inner, self.box]
        self.dirty = False
        self.pushed_at = 0.0

    def _children(self):
        self.inner.children = (self.marker, *(w for w, _ in self.blocks), self.pending)

    def append(self, widget, lines: int) -> None:
        self.blocks.append((widget, lines))
        self.shown += lines
        self._children()

    def clear(self) -> None:
        for widget, _ in self.blocks:
            widget.close()
        self.blocks, self.shown = [], 0


def _pre(body: str) -> str:
    return f'<pre style="margin:0;font-size:12px;line-height:1.35;white-space:pre">{body}</pre>'


class WidgetView(Sink):
    """A Launch sink that draws the live widget view (and leaves a static transcript)."""

    shows_output = True  # the transcript holds each failed rank's traceback

    def __init__(self, spec, publish=None):
        self.spec = spec
        self.c = Collector(spec)
        self._publish = publish or ipy_display
        self.handle = None
        self.header = W.HTML(value="")
        self.info = W.HTML(value="")
        self.panes: dict = {}
        self.root = None
        self._widgets = [self.header, self.info]   # everything to close when the launch ends
        self._hung: dict = {}   # rank -> where it waits, while the idle warning holds
        self._asking = (None, [], None)  # (rank at the input box, ranks waiting for it, why)
        self._header_dirty = True
        self._header_at = 0.0
        self.updates_sent = 0   # pane updates sent to the front end (for tests and budgets)
        self._credit = float(BURST_CHARS)   # token bucket: long lines would otherwise be MB/s
        self._credit_at = time.monotonic()

    # ------------------------------------------------------------ building
    def _build(self):
        shown = sorted(self.c.tails)
        # one layout and style for all blocks (else each HTML widget brings two more models)
        shared = {"layout": W.Layout(margin="0", flex="none"), "style": HTMLStyle()}
        self._widgets += list(shared.values())
        self.panes = {"all": _Pane("all ranks", shared)}
        for r in shown:
            self.panes[r] = _Pane(f"rank {r}", shared)
        order = [r for r in shown] + ["all"]
        boxes = [self.panes[k].box for k in order]
        titles = [self.panes[k].title for k in order]
        if len(shown) <= TAB_LIMIT:
            body = W.Tab(children=boxes)
            body.titles = tuple(titles)
            self.selector = body
        else:
            stack = W.Stack(children=boxes, selected_index=0)
            pick = W.Dropdown(options=titles, index=0, description="show", layout=W.Layout(width="16em"))
            link = W.jslink((pick, "index"), (stack, "selected_index"))  # in the browser, while the cell runs
            self.stack = stack
            body = W.VBox([pick, stack])
            self.selector = pick
            self._widgets += [link, stack, pick]
        self.body = body
        self.order = order
        self.root = W.VBox([self.header, self.info, body])
        self.root.add_class("nbddp-view")
        self._widgets += [body, self.root] + [w for p in self.panes.values() for w in p.widgets]

    def _live_bundle(self) -> dict:
        return {"text/plain": f"nbddp: {self.c.result.world_size} ranks running (live view: ipywidgets); "
                              f"logs in {self.c.result.log_dir}",
                WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.root.model_id}}

    def close(self):
        """Close every widget of the view (and their layouts and styles): no comm outlives the cell.
        Each close is an iopub message the notebook server counts (1,000/s over 3 s), so the
        messages are charged to the kernel's window (nbddp/core/iopubrate.py)."""
        KERNEL_WINDOW.charge(time.monotonic(), 0, msgs=sum(len(p.blocks) for p in self.panes.values())
                             + 3 * len(self._widgets))
        for pane in self.panes.values():
            pane.clear()
        for widget in self._widgets:
            for part in (getattr(widget, "layout", None), getattr(widget, "style", None), widget):
                if isinstance(part, W.Widget):
                    part.close()
        self._widgets = []

    # ------------------------------------------------------------- events
    def launch_started(self, result, spec, backend):
        self.c.launch_started(result, spec, backend)
        self._build()
        hidden = "" if spec.ranks_shown is None else \
            f", showing {label(spec.ranks_shown)}"
        self.info.value = (f'<span style="color:#666;font-size:12px">'
                           f'{html.escape(transcript.launch_line(result, spec, backend, "×"))}{hidden}; '
                           f'full logs in <code>{html.escape(result.log_dir)}</code></span>')
        self._push_header()
        self.handle = self._publish(self._live_bundle(), raw=True, display_id=True)

    def rank_started(self, rank_result):
        self._header_dirty = True

    def output(self, rank: int, stream: str, data: bytes):
        if self._hung:   # output resumed: the hang warning no longer holds
            self._hung = {}
            self._header_dirty = True
        if rank in self.c.tails:   # finished lines, or the pending line changed
            self.c.output(rank, stream, data)
            self.panes[rank].dirty = True
            self.panes["all"].dirty = True

    def display(self, rank: int, bundle: dict):
        if not self.c.display(rank, bundle):
            return
        pane = self.panes[rank]
        self._push_pane(pane, time.monotonic())   # the lines before it first: the order is kept
        rich = W.Output(layout=pane.shared["layout"])
        rich.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)
        pane.append(rich, 0)
        shown = [b for b in pane.blocks if b[1] == 0]
        if len(shown) > transcript.MAX_DISPLAYS:   # bounded: the oldest rich output goes
            pane.blocks.remove(shown[0])
            shown[0][0].close()
            pane._children()

    def note(self, text: str):
        self.c.note(text)
        if text.startswith(IDLE_WARNING):   # a hang, visible while it lasts: banner + amber chips
            self._hung = {r.rank: r.blocked_at for r in self.c.result.ranks
                          if r.ended_at is None and r.state in (RUNNING, STARTING)}
            self._hung_since = time.monotonic()
            self._push_header()
        pane = self.panes.get("all")
        if pane is not None:
            self.c.all.lines.append(("stderr", ("nbddp", text)))
            self.c.all.total += 1
            pane.dirty = True

    def asking(self, rank, waiting, purpose):
        """A rank at a prompt in the input box: banner, chips, and its pane in front (its pdb listing)."""
        if rank is not None and rank != self._asking[0] and rank in self.panes:
            index = self.order.index(rank)
            if isinstance(self.selector, W.Tab):
                self.selector.selected_index = index
            else:
                self.selector.index = index
                self.stack.selected_index = index
        self._asking = (rank, list(waiting), purpose)
        self._push_header()

    def rank_exited(self, rank_result):
        self.c.rank_exited(rank_result)
        self._header_dirty = True
        if rank_result.state not in (OK,) and rank_result.rank in self.panes:
            self._relabel(focus=rank_result.rank if rank_result.state in CAUSING else None)
        for key in (rank_result.rank, "all"):
            if key in self.panes:
                self.panes[key].dirty = True

    def tick(self):
        now = time.monotonic()
        if now - self._header_at >= HEADER_INTERVAL_S and (
                self._header_dirty or any(r.state in (STARTING, RUNNING) for r in self.c.result.ranks)):
            self._push_header()
        if self.c.tick(now) and "all" in self.panes:   # lines said once for several ranks (--same-lines merge)
            self.panes["all"].dirty = True
        self._credit = min(BURST_CHARS, self._credit + (now - self._credit_at) * RATE_CHARS_PER_S)
        self._credit_at = now
        due = [p for p in self.panes.values() if p.dirty and now - p.pushed_at >= PANE_INTERVAL_S]
        due.sort(key=lambda p: p.pushed_at)
        for pane in due:
            if self._credit <= 0:   # the oldest panes go first next time
                break
            self._credit -= self._push_pane(pane, now)
            KERNEL_WINDOW.charge(now, 0, msgs=3)   # a block, its class, the pane's children (about)

    def launch_finished(self, result):
        self.c.launch_finished(result)
        self._push_header()
        now = time.monotonic()
        for pane in self.panes.values():
            self._push_pane(pane, now)
        if self.handle is not None:   # the durable output: the static transcript, no widget
            self.handle.update(transcript.bundle(self.c), raw=True)
        self.close()
        # many ranks' panes close in a burst: the error raised next must not come while the
        # server still counts it over its message rate (it would drop it)
        wait = KERNEL_WINDOW.wait_for(time.monotonic(), 0, msgs=5)
        if wait:
            time.sleep(min(wait, REPORT_WAIT_S))

    def _relabel(self, focus=None):
        """Tab/dropdown labels carry each rank's state; ``focus``: the first rank that failed is shown."""
        labels = []
        for key in self.order:
            res = self.c.result.rank(key) if key != "all" else None
            word = res.state if res is not None and res.state not in (OK, RUNNING, STARTING) else ""
            labels.append(self.panes[key].title + (f" · {word}" if word else ""))
        if focus is not None and not getattr(self, "_focused", False):
            self._focused = True
            index = self.order.index(focus)
        else:
            index = None
        if isinstance(self.selector, W.Tab):
            self.selector.titles = tuple(labels)
            if index is not None:
                self.selector.selected_index = index
        else:
            keep = self.selector.index if index is None else index
            self.selector.options = labels
            self.selector.index = keep
            self.stack.selected_index = keep

    # ------------------------------------------------------------ drawing
    def _push_header(self):
        self._header_dirty = False
        self._header_at = time.monotonic()
        result = self.c.result
        hung = {r: where for r, where in self._hung.items() if result.rank(r) and result.rank(r).ended_at is None}
        banner = ""
        if hung and not self.c.finished:
            where = "; ".join(f"rank {r} blocked at {w}" if w else f"rank {r}: no stack" for r, w in sorted(hung.items()))
            banner = (f'<div class="nbddp-hang" style="margin:3px 0;padding:3px 8px;border-radius:3px;'
                      f'background:#fff1dc;color:#8a4b00;border:1px solid #e0b060">&#9888; no output from any '
                      f'rank for {time.monotonic() - self._hung_since + (self.spec.idle_warning or 0):.0f} s — a hung '
                      f'collective? {html.escape(where)}</div>')
        asking, waiting, purpose = self._asking
        progress = self.c.progress
        if (asking is not None or waiting) and not self.c.finished:
            banner += (f'<div class="nbddp-asking" style="margin:3px 0;padding:3px 8px;border-radius:3px;'
                       f'background:#e8f0fe;color:#1a4d8f;border:1px solid #9bb8e8">&#9998; '
                       f'{html.escape(summary.asking_line(asking, waiting, purpose))}</div>')
            words = "asks for input" if purpose == "input" else "in the debugger"
            progress = (lambda r: words if r == asking else "waits for the debugger" if r in waiting
                        else self.c.progress(r))
        self.header.value = (f'<div><b>{html.escape(transcript.headline(result, self.c.finished))}</b></div>{banner}'
                             f'<div style="display:flex;flex-wrap:wrap">'
                             f'{transcript.chips_html(result, progress=progress, hung=hung)}</div>')

    def _push_pane(self, pane: _Pane, now: float) -> int:
        key = next(k for k, p in self.panes.items() if p is pane)
        if key == "all":
            tail, with_rank = self.c.all, True
            pending = [(s, (r, line)) for r in self.c.tails for s, line in self.c.pending(r)]
            log = self.c.result.log_dir
        else:
            tail, with_rank = self.c.tails[key], False
            pending = self.c.pending(key)
            log = transcript.log_path(self.c.result, key)
        sent = 0
        new = tail.total - pane.sent
        if new > 0:
            keep = tail.lines.maxlen
            if new >= len(tail.lines) or pane.shown + new > keep + SLACK_LINES or len(pane.blocks) >= MAX_BLOCKS:
                pane.clear()   # compact: start again from the tail (rare: a flood, or a long run)
                entries = list(tail.lines)
            else:
                entries = list(itertools.islice(tail.lines, len(tail.lines) - new, None))
            value = _pre(transcript.lines_html(entries, with_rank=with_rank))
            block = W.HTML(value=value, **pane.shared)
            block.add_class("nbddp-block")
            pane.append(block, len(entries))
            pane.sent = tail.total
            sent += len(value)
        hidden = tail.total - pane.shown
        marker = "" if not hidden else (
            f'<div class="nbddp-hidden" style="color:#666;font-size:12px"><i>… {hidden} earlier '
            f'line{"s" if hidden != 1 else ""} hidden; full log: <code>{html.escape(log)}</code></i></div>')
        if pane.marker.value != marker:
            pane.marker.value = marker
        value = _pre(transcript.lines_html(pending, with_rank=with_rank)) if pending else ""
        if pane.pending.value != value:
            pane.pending.value = value
            sent += len(value)
        pane.dirty = False
        pane.pushed_at = now
        self.updates_sent += 1
        return sent
