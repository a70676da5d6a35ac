"""The ranks' prompts, one rank at a time (nbddp/sources/asking.py), without a kernel: the ranks'
side is a recording RankProcs stand-in (what the ranks asked, what they were answered), the
input box one that a test types into, as tests/unit/test_supervisor.py drives the Supervisor
through a Source of its own. The real thing end to end: tests/kernel/test_debugger.py."""
from __future__ import annotations

from nbddp.core import messages as msg
from nbddp.core.summary import asking_line
from nbddp.sources import asking as asking_mod
from nbddp.sources.asking import Asking


class Ranks:
    """What RankProcs gives Asking: the prompts asked, answers sent, who can still be answered."""

    def __init__(self, n=2):
        self.asked, self.answers, self.alive, self.drained = [], [], set(range(n)), []

    def ask(self, rank, ask_id, prompt, purpose=msg.ASK_DEBUGGER):
        self.asked.append((rank, ask_id, prompt, purpose))

    def take_asked(self):
        asked, self.asked = self.asked, []
        return asked

    def waits_for_answer(self, rank):
        return rank in self.alive

    def answer(self, rank, message):
        self.answers.append((rank, message))

    def drain_rank(self, rank):
        self.drained.append(rank)


class Source:
    def __init__(self, ranks):
        self.ranks = ranks

    def asking_ranks(self):
        return self.ranks


class Box:
    def __init__(self):
        self.shown, self.typed = [], None

    def ask(self, prompt):
        self.shown.append(prompt)

    def answer(self):
        typed, self.typed = self.typed, None
        return typed

    def cancel(self):
        pass


def make(box=True):
    ranks, events = Ranks(), []
    a = Asking(Source(ranks), lambda *e: events.append(e), Box() if box else None)
    return a, ranks, events


def test_one_rank_at_a_time_the_other_waits_named_until_c():
    a, ranks, events = make()
    ranks.ask(1, 1, None)          # rank 1's debugger asks for its turn: granted, nothing shown yet
    ranks.ask(0, 1, None)
    a.step()
    assert ranks.answers == [(1, (msg.ANSWER, 1, ""))] and a.box.shown == []
    ranks.ask(1, 2, "(Pdb rank 1) ")
    a.step()
    assert a.box.shown == ["(Pdb rank 1) "] and ranks.drained == [1]
    assert ("asking", 1, [0], msg.ASK_DEBUGGER) in events
    a.box.typed = "n"              # `n`: rank 1 keeps the box between its prompts
    a.step()
    assert ranks.answers[-1] == (1, (msg.ANSWER, 2, "n")) and a.busy
    a.step()
    assert len(ranks.answers) == 2, "rank 0 must wait while rank 1 is in the debugger"
    ranks.ask(1, None, None, msg.LEFT_DEBUGGER)   # `c`
    a.step()
    assert ranks.answers[-1] == (0, (msg.ANSWER, 1, "")), "rank 0's turn"


def test_a_holder_that_runs_on_without_asking_yields_the_box_after_a_while(monkeypatch):
    a, ranks, _ = make()
    ranks.ask(1, 1, None)
    a.step()
    ranks.ask(0, 1, None)
    monkeypatch.setattr(asking_mod, "HOLD_S", 0.0)
    a.step()
    assert ranks.answers[-1] == (0, (msg.ANSWER, 1, ""))


def test_without_a_front_end_every_prompt_is_refused_at_once():
    a, ranks, _ = make(box=False)
    ranks.ask(0, 1, "[rank 0] lr? ", msg.ASK_INPUT)
    ranks.ask(1, 1, None)
    a.step()
    assert ranks.answers == [(0, (msg.NO_ANSWER, 1, msg.NO_FRONTEND)), (1, (msg.NO_ANSWER, 1, msg.NO_FRONTEND))]
    assert not a.busy


def test_pdb_post_mortem_is_the_first_failing_ranks_only():
    a, ranks, _ = make()
    ranks.ask(1, 1, None, msg.ASK_POST_MORTEM)
    ranks.ask(0, 1, None, msg.ASK_POST_MORTEM)
    a.step()
    ranks.ask(1, None, None, msg.LEFT_DEBUGGER)
    a.step()
    assert ranks.answers == [(1, (msg.ANSWER, 1, "")), (0, (msg.NO_ANSWER, 1, msg.NOT_FIRST))]


def test_input_prompts_do_not_hold_the_box_and_a_dead_rank_is_skipped():
    a, ranks, _ = make()
    ranks.ask(1, 1, "[rank 1] lr? ", msg.ASK_INPUT)
    ranks.ask(0, 1, "[rank 0] lr? ", msg.ASK_INPUT)
    a.step()
    a.box.typed = "0.1"
    a.step()
    assert a.box.shown == ["[rank 1] lr? ", "[rank 0] lr? "]
    ranks.alive.discard(0)         # ended at its prompt (the stop button, a crash)
    a.step()
    assert not a.busy


def test_the_view_line_names_who_is_at_the_prompt_and_who_waits():
    assert asking_line(1, [0], msg.ASK_DEBUGGER) == \
        "rank 1 is in the debugger (answer in the input box); rank 0 waits for it"
    assert asking_line(0, [1, 2], msg.ASK_INPUT) == \
        "rank 0 asks for input (answer in the input box); ranks 1–2 wait for it"
