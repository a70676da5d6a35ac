"""The process that hosts every launch's rendezvous store and answers the CUDA device count, so the
kernel never imports torch. Forked by the forkserver, it ends with the kernel (its pipe closes);
a TCPStore's master connects to itself, so in a private network it must live in the ranks'
namespace, which the kernel (it has threads) cannot enter. Requests, one at a time over the pipe:
``("host", master_addr, port)`` → ``("ok", port)`` | ``("error", one line)``; ``("drop", port)``
once its launch ended; ``("devices", env)`` → ``("ok", count)`` (a leaf: CUDA here harms no fork).
Fails closed: when ready it says its network (nbddp/rank/netrecord.py); a launch is refused in one
line (``not_private``) where private was asked and it or its forkserver is not, before any rank."""
from __future__ import annotations

import atexit
import os
import threading
from contextlib import contextmanager

import multiprocess.forkserver

from nbddp.core import settings
from nbddp.core.errors import DDPUsageError
from nbddp.forkserver import privnet, starter
from nbddp.forkserver.tcpstore import host_store
from nbddp.kernel import forkguard
from nbddp.rank import netrecord
from nbddp.rank.procname import set_name

ANSWER_S = 30.0  # a TCPStore starts in milliseconds; past this the host is stuck

_lock = threading.Lock()
_host: dict = {}  # "conn", "process", "net" of the running host, once started


def serve(conn) -> None:
    """The host's loop (in a process forked by the forkserver): until the kernel goes away."""
    set_name(b"nbddp-stores")
    stores: dict[int, object] = {}  # port -> its TCPStore, held until the kernel goes
    if netrecord.is_private():
        privnet.answer_names()
    conn.send(("ready", privnet.network_id(), netrecord.failure()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the kernel ended: the stores go with this process
        if request[0] == "drop":
            stores.pop(request[1], None)
            continue
        if request[0] == "devices":
            conn.send(("ok", _device_count(request[1])))
            continue
        try:
            store, port = host_store(request[1], request[2])
        except DDPUsageError as exc:
            conn.send(("error", str(exc)))
            continue
        stores[port] = store
        conn.send(("ok", port))


def _device_count(env: dict) -> int:
    """torch's CUDA device count with the kernel's device variables (0 without CUDA)."""
    for name in DEVICE_VARIABLES:
        if name in env:
            os.environ[name] = env[name]
        else:
            os.environ.pop(name, None)
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


# what decides which CUDA devices torch sees (read in the kernel, applied in the host)
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES",
                    "ROCR_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK")
_drops: list = []  # ports whose launch ended while a request held the pipe: sent with the next


class HostedStore:
    """The kernel's handle on one store in the host; dropping it releases the store."""

    def __init__(self, port: int):
        self.port = port

    def __del__(self):
        _drops.append(self.port)  # list.append is atomic: no lock, never a wait here
        if _lock.acquire(blocking=False):  # else the request holding the pipe sends it
            try:
                _send_drops(_host.get("conn"))
            finally:
                _lock.release()


def _send_drops(conn) -> None:
    """Release the stores of ended launches (the caller holds ``_lock``) before a new one: a
    fixed --master-port is free again for the next launch, as with a store in the kernel."""
    while _drops:
        port = _drops.pop()
        try:
            if conn is not None:
                conn.send(("drop", port))
        except (OSError, ValueError):
            pass


_count: list = []  # torch's device count, asked once per kernel (torch counts once per process)


def device_count() -> int:
    """How many CUDA devices torch sees for this kernel's ranks (0 without CUDA), asked of the
    host, so the kernel neither imports torch nor initialises CUDA."""
    with _locked():
        if not _count:
            _count.append(_counted(_running()))
    return _count[0]


def _counted(conn) -> int:
    """The host's count under this kernel's device variables (the caller holds ``_lock``)."""
    env = {name: os.environ[name] for name in DEVICE_VARIABLES if name in os.environ}
    reply = _ask(conn, ("devices", env))
    if reply[0] != "ok":
        _stop()  # an answer may still come: the next request starts a new host
        raise DDPUsageError(f"%%ddp: could not count the CUDA devices: {reply[1]}")
    return reply[1]


@contextmanager
def _locked():
    """Hold ``_lock``. Where the warm-up holds it (a new forkserver is importing torch before
    it forks the host), the running cell says so while it waits (nbddp/views/startnote.py; the
    ranks' start or the cell's end clears it)."""
    if not _lock.acquire(blocking=False):
        starter.show_note()
        _lock.acquire()
    try:
        yield
    finally:
        _lock.release()


def _ask(conn, request):
    """One request and its answer (the caller holds ``_lock``); ("error", why) on no answer."""
    try:
        conn.send(request)
        answered = conn.poll(ANSWER_S)
        return conn.recv() if answered else ("error", f"no answer within {ANSWER_S:g} s")
    except (EOFError, OSError) as exc:
        return ("error", f"the store host ended ({exc or 'pipe closed'})")


def start() -> None:
    """Start the host now; errors are left for the first launch to report."""
    with _locked():
        _running()


def host(master_addr: str, port: int | None):
    """A store for one launch: (handle, port). Raises DDPUsageError (one line) where the port is
    taken, or (``NBDDP_PRIVATE_NET=1``) where the ranks would not be in a private network."""
    private = privnet.requested()
    with _locked():
        conn = _running()
        why = _why_not_private() if private else ""
        if why and not _host.get("why"):  # a host left from an earlier forkserver: one new start
            _stop()
            conn = _running()
            why = _why_not_private()
        if why:
            _stop()
            raise DDPUsageError(refusal(why))
        _send_drops(conn)
        reply = _ask(conn, ("host", master_addr, port))
        if reply[0] != "ok":
            if not reply[1].startswith("%%ddp:"):
                _stop()  # the next launch starts a new host
                where = " in the private network" if private else ""
                raise DDPUsageError(f"%%ddp: could not start the rendezvous store{where}: {reply[1]}")
            raise DDPUsageError(reply[1])
    return HostedStore(reply[1]), reply[1]


def refusal(why: str) -> str:
    ENV = settings.PRIVATE_NET.name
    return (f"%%ddp: this kernel's ranks are to run in a private network ({ENV}=1), but {why}; "
            f"no rank was started (a new kernel with {ENV}=0 runs them on the machine's network)")


def not_private(host_net: str | None, host_why: str, forkserver_net: str | None, kernel_net: str) -> str:
    """Why a launch would not be private ("" where it would): the host's report of the
    forkserver, or the networks the host, the forkserver and this kernel are in."""
    if host_why:
        return host_why
    if not host_net or host_net == kernel_net:
        return f"the process hosting the stores is on this kernel's own network ({kernel_net})"
    if forkserver_net == kernel_net:
        return f"the forkserver is on this kernel's own network ({kernel_net})"
    if forkserver_net is not None and forkserver_net != host_net:
        return (f"the forkserver ({forkserver_net}) and the process hosting the stores "
                f"({host_net}) are in different networks")
    return ""


def _why_not_private() -> str:
    return not_private(_host.get("net"), _host.get("why", ""), _forkserver_network(), privnet.network_id())


def _forkserver_network() -> str | None:
    """The network the running forkserver (the ranks' parent) is in; None where it cannot be
    read (it ended: the ranks' start then fails or starts a new one, checked by the ranks)."""
    from multiprocess import forkserver

    pid = forkserver._forkserver._forkserver_pid
    try:
        return None if pid is None else os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def network() -> str | None:
    """The network namespace the stores (and so the ranks) are in; None before the first."""
    return _host.get("net")


def _running():
    """The host's pipe, starting the host first where needed (the caller holds ``_lock``)."""
    process = _host.get("process")
    if process is not None and process.exitcode is None:
        return _host["conn"]
    _stop()
    ctx = starter.context("forkserver")
    # not starter.ensure_forkserver(): the launch's own call must still see a replaced forkserver
    # and say so in its one line
    multiprocess.forkserver.ensure_running()
    conn, child = ctx.Pipe(duplex=True)
    # daemonic: at the interpreter's exit multiprocess ends it rather than waiting for it (it
    # waits on this pipe, so a plain script using nbddp.run would never end); _at_exit closes
    # the pipe first, so it normally ends on its own
    process = ctx.Process(target=serve, args=(child,), name="nbddp-stores", daemon=True)
    starter.start(process)
    child.close()
    if not conn.poll(ANSWER_S):
        process.kill()
        raise DDPUsageError("%%ddp: the rendezvous store host did not start")
    try:
        ready = conn.recv()
    except (EOFError, OSError):
        process.kill()
        raise DDPUsageError("%%ddp: the rendezvous store host ended as it started") from None
    _host.update(conn=conn, process=process, net=ready[1], why=ready[2] if len(ready) > 2 else "")
    if not _exit_hooked:
        _exit_hooked.append(True)
        atexit.register(_at_exit)  # registered after multiprocess's own hook, so it runs first
    forkguard.on_child(_forget_in_child)  # a child the kernel forks must not keep the host alive
    return conn


_exit_hooked: list = []


def _forget_in_child() -> None:
    """In a child the kernel forked (forkguard): close its copy of the host's pipe through the
    Connection, so the object, dropped here, does not close the descriptor again when collected
    (that printed "Exception ignored … Bad file descriptor" into torchrun's output)."""
    conn = _host.get("conn")
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass
    _host.clear()


def _at_exit() -> None:
    """At the interpreter's exit: close the pipe so the host ends on its own (no wait here:
    the lock may be held by a thread the exit abandons)."""
    conn, process = _host.pop("conn", None), _host.pop("process", None)
    if conn is not None:
        conn.close()
    if process is not None:
        process.join(2)


def _stop() -> None:
    _drops.clear()  # the stores go with the host
    conn, process = _host.pop("conn", None), _host.pop("process", None)
    _host.pop("net", None)
    _host.pop("why", None)
    if conn is not None:
        conn.close()
    if process is not None:
        if process.exitcode is None:
            process.kill()
        process.join(2)


# Set once warm_up has asked for the forkserver (at once without a warm-up): the extension's
# pre_run_cell hook waits for it (nbddp/views/startnote.py). The kernel imports no torch, so a
# cell need not wait for the forkserver's import; a launch waits for the host (``_locked``).
torch_ready = threading.Event()
torch_ready.set()


def warm_up() -> threading.Thread:
    """Start the forkserver (it imports torch) and the store host in the background, so the
    first cell does not pay for them while the user is still typing; the kernel itself never
    imports torch. The first cell runs at once (its setup overlaps the forkserver's import);
    its launch waits for the host, saying why (``_locked``)."""
    def work():
        _lock.acquire()  # before the first cell can ask: it then waits here, not in a start of its own
        try:
            starter.context("forkserver")
            multiprocess.forkserver.ensure_running()
            torch_ready.set()
            if not _count:
                _count.append(_counted(_running()))  # once per kernel: now, not in the first cell
        except Exception:
            pass  # the first launch will start it and report any real problem
        finally:
            torch_ready.set()
            _lock.release()

    torch_ready.clear()
    thread = threading.Thread(target=work, name="nbddp-warm-up", daemon=True)
    thread.start()
    return thread

