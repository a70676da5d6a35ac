"""Live view of a launch: a status output (headline, hang banner, one chip per rank, the launch line)
above an ipywidgets view with one pane per rank and an "all ranks" pane. The status is a plain
display updated under its display_id, not a widget, so a notebook saved mid-run keeps its last
state; at the end it becomes the static transcript (nbddp/views/transcript.py) and every widget is
closed, so a saved notebook reads the same anywhere and the kernel keeps no widgets. Streams go
through a terminal model (nbddp/views/terminal.py). Bounded: a pane keeps about TAIL_LINES lines in
SLOTS reused blocks, and updates go out from ``tick`` only, at most every PANE_INTERVAL_S per pane
within a RATE_CHARS_PER_S budget, whatever the ranks produce."""
from __future__ import annotations

import html
import itertools
import time
from typing import Any

import ipywidgets as W
from IPython.display import display as ipy_display
from ipywidgets.widgets.widget_string import HTMLStyle

from nbddp.core import summary
from nbddp.core.diagnosis import IDLE_WARNING
from nbddp.core.result import OK, RUNNING, STARTING
from nbddp.core.sink import Sink
from nbddp.core.states import CAUSING
from nbddp.core.summary import label
from nbddp.views import transcript
from nbddp.views.textview import KERNEL_WINDOW, REPORT_WAIT_S
from nbddp.views.transcript import Collector

TAB_LIMIT = 8            # more shown ranks than this: a dropdown instead of a tab strip
PANE_INTERVAL_S = 0.25   # a pane is re-sent at most 4 times a second
HEADER_INTERVAL_S = 0.5
RATE_CHARS_PER_S = 1_000_000  # pane HTML sent to the front end per second, on average, at most
BURST_CHARS = 1_000_000       # what may go out at once after a quiet spell
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# A notebook saved while the cell ran, reopened once its kernel is gone: the live view's output
# reads "Error displaying widget: model not found" (ipywidgets draws a view only from a live
# model, or from widget state the front end saved, which JupyterLab does not by default). The
# status above it is the last state shown; this rule (in that status, so only while it is the
# cell's status) puts one line in place of the error (the output ipywidgets' renderer marks
# .jupyter-widgets). A drawn view contains .nbddp-view and is untouched; the rule needs a trusted
# notebook (one its user saved) and CSS :has().
_ORPHAN = ".jp-OutputArea:has(.nbddp-status) .jp-OutputArea-output.jupyter-widgets:not(:has(.nbddp-view))"
ORPHANED_VIEW_CSS = (
    f'<style>{_ORPHAN}{{font-size:0;color:transparent}}{_ORPHAN}::before'
    '{content:"nbddp: the live view could not be drawn here: the kernel that ran this cell is gone (the '
    'status above is the last state it showed), or this front end cannot render ipywidgets 8";'
    'font-size:var(--jp-content-font-size1,13px);color:var(--jp-ui-font-color2,#616161)}</style>')
SLOTS = 16               # HTML blocks holding a pane's lines, reused oldest first


class _Pane:
    """One rank's (or all ranks') scrolling pane, made so that nothing the user looks at is
    replaced: its lines live in up to SLOTS HTML blocks of ``per_slot`` lines each. New lines go
    into the newest ("open") block, which alone is re-sent; when it is full the next block takes
    over, and once SLOTS blocks exist the oldest block is emptied and reused at the bottom (its
    CSS ``order`` moves it there; the list of children never changes, because ipywidgets
    re-creates the views of every child after the first changed one). So the other blocks keep
    their DOM: a selection in them survives, and the scroller, created once, keeps its position
    (column-reverse: pinned to the newest line while the user is at the bottom, left alone when
    they scrolled up). Rich outputs are Output blocks in the same order, reused the same way
    past MAX_DISPLAYS.
    """

    def __init__(self, title: str, shared: dict, capacity: int):
        self.title = title
        self.shared = shared
        self.per_slot = max(1, -(-capacity // (SLOTS - 1)))   # SLOTS - 1 full blocks hold the tail
        self.marker = W.HTML(value="", **shared)
        self.pending = W.HTML(value="", **shared)
        self.slots: list = []         # [widget, entries] in creation order
        self.rich: list = []          # Output widgets, creation order
        self.open: list[Any] | None = None  # the slot new lines go into: [widget, entries]
        self.seq = 0                  # the CSS order of the next block
        self.sent = 0                 # the tail's total when lines were last taken
        self.ring = W.VBox([], layout=W.Layout(flex="none", overflow="visible"))
        # flex:none — a box shrinks to its scroller's height (and scrolls itself) otherwise
        self.inner = W.VBox([self.marker, self.ring, self.pending], layout=W.Layout(flex="none", overflow="visible"))
        self.box = W.VBox([self.inner], layout=W.Layout(
            max_height="26em", overflow="auto", display="flex", flex_flow="column-reverse",
            border="1px solid var(--jp-border-color2, #ddd)", padding="2px 6px"))
        self.box.add_class("nbddp-pane")
        self.widgets = [self.marker, self.pending, self.ring, self.inner, self.box]
        self.dirty = False
        self.pushed_at = 0.0

    @property
    def shown(self) -> int:
        return sum(len(entries) for _, entries in self.slots)

    def _bottom(self, pool: list, make, limit: int):
        """A block for the bottom of the pane: a new widget (``make``, appended to ``pool``) while
        ``pool`` has fewer than ``limit``, else its oldest one, moved down."""
        if len(pool) < limit:
            widget = make(W.Layout(margin="0", flex="none", order=str(self.seq)))
            pool.append(widget)
            self.ring.children = (*self.ring.children, widget)   # appended: no other view is redrawn
        else:
            widget = min(pool, key=lambda w: int(w.layout.order))
            widget.layout.order = str(self.seq)
        self.seq += 1
        return widget

    def take(self, entries: list) -> list:
        """Put new lines into the open slot and the ones after it; returns the slots that changed."""
        changed = []
        while entries:
            if self.open is None or len(self.open[1]) >= self.per_slot:
                widget = self._bottom([w for w, _ in self.slots], self._slot_widget, SLOTS)
                self.open = next((s for s in self.slots if s[0] is widget), None)
                if self.open is None:
                    self.open = [widget, []]
                    self.slots.append(self.open)
                self.open[1] = []
            room = self.per_slot - len(self.open[1])
            self.open[1].extend(entries[:room])
            entries = entries[room:]
            if self.open not in changed:
                changed.append(self.open)
        return changed

    def _slot_widget(self, layout):
        widget = W.HTML(value="", layout=layout, style=self.shared["style"])
        widget.add_class("nbddp-block")
        return widget

    def empty(self) -> None:
        """Every slot but the open one emptied; the open one is refilled from its start."""
        for slot in self.slots:
            if slot is not self.open and slot[1]:
                slot[0].value = ""
            slot[1] = []

    def add_rich(self, bundle: dict) -> None:
        self.open = None   # lines after it go below it
        widget = self._bottom(self.rich, lambda layout: W.Output(layout=layout), transcript.MAX_DISPLAYS)
        widget.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)

    def close(self) -> None:
        for widget in [w for w, _ in self.slots] + self.rich:
            widget.layout.close()
            widget.close()
        self.slots, self.rich = [], []


def _pre(body: str) -> str:
    return f'<pre style="margin:0;font-size:12px;line-height:1.35;white-space:pre">{body}</pre>'


class WidgetView(Sink):
    """A Launch sink that draws the live widget view (and leaves a static transcript)."""

    shows_output = True  # the transcript holds each failed rank's traceback

    def __init__(self, spec, publish=None):
        self.spec = spec
        self.c = Collector(spec)
        self._publish = publish or ipy_display
        self.handle = None      # the widget's display
        self.status = None      # the status display above it: HTML and text, both kept current
        self._status_sent: dict = {}
        self.info = ""          # the launch line, HTML
        self.panes: dict = {}
        self.root = None
        self._widgets = []      # everything to close when the launch ends
        self._hung: dict = {}   # rank -> where it waits, while the idle warning holds
        # (rank at the input box, ranks waiting for it, why)
        self._asking: tuple[int | None, list[int], str | None] = (None, [], None)
        self._header_dirty = True
        self._header_at = 0.0
        self.updates_sent = 0   # pane updates sent to the front end (for tests and budgets)
        self._credit = float(BURST_CHARS)   # token bucket: long lines would otherwise be MB/s
        self._credit_at = time.monotonic()

    # ------------------------------------------------------------ building
    def _build(self):
        shown = sorted(self.c.tails)
        # one layout and style for the small widgets (else each HTML widget brings two more models)
        shared = {"layout": W.Layout(margin="0", flex="none"), "style": HTMLStyle()}
        self._widgets += list(shared.values())
        self.panes = {"all": _Pane("all ranks", shared, self.c.all.lines.maxlen)}
        for r in shown:
            self.panes[r] = _Pane(f"rank {r}", shared, self.c.tails[r].lines.maxlen)
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
        self.root = W.VBox([body])
        self.root.add_class("nbddp-view")
        self._widgets += [body, self.root] + [w for p in self.panes.values() for w in p.widgets]

    def _live_bundle(self) -> dict:
        # a front end re-creates a widget's view whenever its display is updated, so this text
        # stays as it is: the status display above carries the current state in text
        return {"text/plain": "(nbddp live view of each rank's output, ipywidgets: the status above "
                              "is the last state it showed)",
                WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.root.model_id}}

    def close(self):
        """Close every widget of the view (and their layouts and styles): no comm outlives the cell.
        Each close is an iopub message the notebook server counts (1,000/s over 3 s), so the
        messages are charged to the kernel's window (nbddp/core/iopubrate.py)."""
        blocks = sum(len(p.slots) + len(p.rich) for p in self.panes.values())   # each with its own layout
        KERNEL_WINDOW.charge(time.monotonic(), 0, msgs=2 * blocks + 3 * len(self._widgets))
        for pane in self.panes.values():
            pane.close()
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
        self.info = (f'<div style="color:{transcript.MUTED};font-size:12px">'
                     f'{html.escape(transcript.launch_line(result, spec, backend, "×"))}{hidden}; '
                     f'full logs in <code>{html.escape(result.log_dir)}</code></div>')
        self._status_sent = self._status_bundle()
        self.status = self._publish(self._status_sent, raw=True, display_id=True)
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
        pane.add_rich(bundle)

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
            self.handle.update({"text/html": "", "text/plain": ""}, raw=True)
            self.status.update(transcript.bundle(self.c), raw=True)
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
            res = self.c.result.rank(key) if isinstance(key, int) else None  # key: a rank, or "all"
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
        bundle = self._status_bundle()
        if bundle != self._status_sent and self.status is not None:
            self._status_sent = bundle
            self.status.update(bundle, raw=True)

    def _status_bundle(self) -> dict:
        """The status display: headline, hang banner, chips and the launch line in HTML, and the
        same state in text (ranks, states, last lines), so a notebook saved while the cell runs
        reads as the last state shown even after the kernel is gone."""
        self._header_dirty = False
        self._header_at = time.monotonic()
        result = self.c.result
        hung = {r: where for r, where in self._hung.items() if result.rank(r) and result.rank(r).ended_at is None}
        banner = ""
        if hung and not self.c.finished:
            where = "; ".join(f"rank {r} blocked at {w}" if w else f"rank {r}: no stack"
                              for r, w in sorted(hung.items()))
            fg, bg = transcript.STATE_COLORS["hung"]
            banner = (f'<div class="nbddp-hang" style="margin:3px 0;padding:3px 8px;border-radius:3px;'
                      f'line-height:1.4;background:{bg};color:{fg};border:1px solid {fg}">&#9888; no output from any '
                      f'rank for {time.monotonic() - self._hung_since + (self.spec.idle_warning or 0):.0f} s — a hung '
                      f'collective? {html.escape(where)}</div>')
        asking, waiting, purpose = self._asking
        progress = self.c.progress
        if (asking is not None or waiting) and not self.c.finished:
            fg, bg = transcript.themed("#1a4d8f"), transcript.tint("#1a4d8f")
            banner += (f'<div class="nbddp-asking" style="margin:3px 0;padding:3px 8px;border-radius:3px;'
                       f'background:{bg};color:{fg};border:1px solid {fg}">&#9998; '
                       f'{html.escape(summary.asking_line(asking, waiting, purpose))}</div>')
            words = "asks for input" if purpose == "input" else "in the debugger"

            def asking_progress(r):
                return words if r == asking else "waits for the debugger" if r in waiting else self.c.progress(r)
            progress = asking_progress
        return {"text/plain": transcript.live_text(self.c, hung),
                "text/html": (f'<div class="nbddp-status" style="line-height:1.4">'
                              f'<div><b>{html.escape(transcript.headline(result, self.c.finished))}</b></div>{banner}'
                              f'<div style="display:flex;flex-wrap:wrap">'
                              f'{transcript.chips_html(result, progress=progress, hung=hung)}</div>'
                              f'{self.info}{ORPHANED_VIEW_CSS}</div>')}

    def _push_pane(self, pane: _Pane, now: float) -> int:
        key = next(k for k, p in self.panes.items() if p is pane)
        pending: list[tuple[str, Any]]  # (stream, line); the interleaved pane's lines say their rank
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
            entries = list(itertools.islice(tail.lines, max(0, len(tail.lines) - new), None))
            if new >= pane.per_slot * (SLOTS - 1):   # a flood: every block would be replaced anyway,
                pane.empty()                         # so only the newest block's worth is shown
                entries = entries[-pane.per_slot:]
            for widget, lines in pane.take(entries):
                widget.value = _pre(transcript.lines_html(lines, with_rank=with_rank))
                sent += len(widget.value)
            pane.sent = tail.total
        hidden = tail.total - pane.shown
        marker = "" if not hidden else (
            f'<div class="nbddp-hidden" style="color:{transcript.MUTED};font-size:12px"><i>… {hidden} earlier '
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
