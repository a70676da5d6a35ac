"""A rank's final state and cause from how it ended, as torchrun reports them: its own exit code
and exception, unless a signal nbddp sent ended it (then why nbddp stopped the launch). Pure
rules over a RankResult, shared by every source (forkserver ranks, a pool's, torchrun's)."""
from __future__ import annotations

import signal
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from nbddp.core import diagnosis
from nbddp.core.states import RankState, StopReason

if TYPE_CHECKING:
    from nbddp.core.result import RankResult

Stop = tuple[StopReason, str]  # why nbddp stopped a launch: its reason and the words for it

_C_LONG = 1 << 63


def exit_status(code: object) -> int:
    """The exit status a process ends with after ``sys.exit(code)``, as CPython computes it
    (pythonrun.c: the code as a C long, its low 8 bits; an int too large for one is -1): None
    is 0, an int its low byte (``sys.exit(-9)`` exits 247, not "killed by SIGKILL";
    ``sys.exit(256)`` exits 0), anything else (a message, printed) is 1. A rank reports this,
    so nbddp says what its launcher and shell see."""
    if code is None:
        return 0
    if isinstance(code, int):
        return (code if -_C_LONG <= code < _C_LONG else -1) & 0xFF
    return 1


def ended_by_nbddp(code: int | None, exception: dict[str, Any] | None, sent: Collection[int]) -> bool:
    """Did one of the signals nbddp ``sent`` end the rank (not its own exit or crash)? With no
    code (its forkserver ended, and it was ended before it could report one): if nbddp sent any."""
    if code is None:
        return bool(sent)
    if code < 0:
        return -code in sent
    return signal.SIGINT in sent and (code == 130 or (exception or {}).get("type") == "KeyboardInterrupt")


def lost_peer(exception: dict[str, Any] | None) -> bool:
    """Did the rank fail because a rank it waited for in a collective ended under it? Once nbddp
    is stopping a launch, that is nbddp's doing, not a failure of the rank's own: signals reach
    the ranks one after another, and a rank can see its peer's socket close (and raise) before
    its own signal arrives (most often on a loaded machine)."""
    return exception is not None and bool(diagnosis.PEER_LOST.search(exception.get("message", "")))


def ended_by_the_stop(stop: Stop | None, by_signal: bool, exception: dict[str, Any] | None) -> bool:
    """Once nbddp is stopping a launch (``stop``): a rank that one of its signals ended
    (``by_signal``) or that lost a peer those signals ended was stopped, not failed."""
    return stop is not None and (by_signal or lost_peer(exception))


def settle(res: RankResult, stop: Stop | None, sent: Collection[int]) -> None:
    """``res.state`` and ``res.cause`` from its exit code and exception, as torchrun reports
    them: a rank that exited by itself keeps its own code and message; "stopped by nbddp" is
    only for ranks a signal from nbddp ended (``stop`` = (reason, why) once it was signalled),
    or the loss of a peer that nbddp's signal ended."""
    code = res.exitcode
    if stop is not None and ended_by_the_stop(stop, ended_by_nbddp(code, res.exception, sent), res.exception):
        stopped_state(res, stop)
    elif killed_in_its_exit(code, stop, sent):
        res.state, res.exitcode = RankState.KILLED, -signal.SIGKILL
        res.cause = ("its cell ended well, but its process was still exiting (atexit handlers, non-daemon "
                     "threads such as a final checkpoint) when --exit-grace ran out, so nbddp killed it")
    elif code == 0:
        res.state, res.cause = RankState.OK, ""
    elif code is not None and code < 0:
        res.state, res.cause = RankState.KILLED, diagnosis.describe_signal(-code)
    else:
        res.state, res.cause = RankState.FAILED, diagnosis.describe_failure(res.exception, code)


def killed_in_its_exit(code: int | None, stop: Stop | None, sent: Collection[int]) -> bool:
    """A rank whose cell ended well (its code, 0, is the cell's: nbddp/sources/forkranks.py) and
    that nbddp then SIGKILLed outside any stop: its exit (atexit handlers, non-daemon threads)
    outlasted the exit grace (nbddp/sources/supervisor.py). Not ok: that work was cut short."""
    return code == 0 and stop is None and set(sent) == {signal.SIGKILL}


def stopped_state(res: RankResult, stop: Stop) -> None:
    """The state of a rank that nbddp's signal ended, by why it was stopped."""
    reason, why = stop
    if reason == StopReason.TIMEOUT:
        res.state, res.cause = RankState.TIMED_OUT, ""
    elif reason == StopReason.INTERRUPT:
        res.state, res.cause = RankState.INTERRUPTED, "stopped by the interrupt"
    else:
        res.state, res.cause = RankState.TERMINATED, f"stopped by nbddp {why}"


# --------------------------------------------------------- under torchrun's agent
def settle_torchrun(res: RankResult, stop: Stop | None, sent: Collection[int], others_failed: bool,
                    closed: set[int] | None = None) -> None:
    """As ``settle``, for a rank of torchrun's: a SIGTERM/SIGKILL that nbddp did not send is
    torchrun's own fail-fast (the rank did not fail by itself) where torchrun's log says it
    signalled this rank (``closed``: the pids it did, nbddp/core/diagnosis.py's
    ``agent_closed``); where its log says nothing (None), once another rank failed by itself.
    A rank killed by a signal torchrun did not send is the cause (killed by itself, from
    outside, or by the OOM killer), and a peer that lost it in a collective failed after it."""
    by_signal = res.exitcode in (-signal.SIGTERM, -signal.SIGKILL)
    by_torchrun = (res.pid in closed) if closed is not None else others_failed
    if (stop is None or not ended_by_nbddp(res.exitcode, res.exception, sent)) and by_signal and by_torchrun:
        res.state, res.cause = RankState.TERMINATED, "stopped by torchrun after another rank failed"
    else:
        settle(res, stop, sent)


def failed_by_itself(res: RankResult) -> bool:
    """A rank whose failure is a cause, not a symptom: failed (not by losing a peer in a
    collective, which another rank's end caused) or killed."""
    return res.state == RankState.KILLED or (res.state == RankState.FAILED and not lost_peer(res.exception))


def settle_unreported(res: RankResult, stop: Stop | None, agent_code: int | None, first_failed: int | None) -> bool:
    """The state of a torchrun rank whose status file never said how it ended, from what is
    known of the launch: nbddp stopped it, it never started, torchrun stopped it after rank
    ``first_failed`` failed, or torchrun failed. False where the agent's success (code 0) says
    the rank ended well: the caller settles it as exit code 0."""
    if stop is not None:  # ended by nbddp's signals, its status never written
        res.exitcode = None
        stopped_state(res, stop)
    elif res.pid is None:
        res.state, res.cause = RankState.FAILED, "never started (torchrun ended before this rank ran)"
    elif first_failed is not None:
        res.state, res.cause = RankState.TERMINATED, f"stopped by torchrun after rank {first_failed} failed"
    elif agent_code == 0:
        return False
    else:
        res.state, res.cause = RankState.FAILED, f"ended without an exit status (torchrun exited with {agent_code})"
    return True
