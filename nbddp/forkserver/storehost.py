"""The process that hosts the rendezvous stores inside the kernel's private network
(``NBDDP_PRIVATE_NET=1``, nbddp/forkserver/privnet.py). A TCPStore's master also connects to itself, so it
must live in the ranks' network namespace; the kernel cannot enter one (it has threads), so one
small process forked by the (private) forkserver hosts every launch's store on request, and
ends with the kernel (its pipe closes). Requests, one at a time over that pipe:
``("host", master_addr, port)`` → ``("ok", port)`` | ``("error", one line)``, and
``("drop", port)`` when the launch that used it has ended.

Fail closed: the host says, when it is ready, which network it is in and whether the forkserver
it was forked from could not enter the private one (nbddp/rank/netrecord.py); a launch is refused in
one line (``NotPrivate``) where it could not, where the host or the forkserver is on the
kernel's own network, or where the two differ, before any rank starts.
"""
from __future__ import annotations

import os
import threading

from nbddp.core import settings
from nbddp.core.errors import DDPUsageError
from nbddp.forkserver import privnet
from nbddp.forkserver import starter
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
    stores = {}
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
        try:
            store, port = host_store(request[1], request[2])
        except DDPUsageError as exc:
            conn.send(("error", str(exc)))
            continue
        stores[port] = store
        conn.send(("ok", port))


class HostedStore:
    """The kernel's handle on one store in the host; dropping it releases the store."""

    def __init__(self, port: int):
        self.port = port

    def __del__(self):
        if _lock.acquire(blocking=False):  # never wait here: a request is on the pipe
            try:
                conn = _host.get("conn")
                if conn is not None:
                    conn.send(("drop", self.port))
            except (OSError, ValueError):
                pass
            finally:
                _lock.release()


def host(master_addr: str, port: int | None):
    """A store for one launch, hosted in the private network: (handle, port). Raises
    DDPUsageError (one line) where the ranks would not be in a private network."""
    with _lock:
        conn = _running()
        why = _why_not_private()
        if why and not _host.get("why"):  # a host left from an earlier forkserver: one new start
            _stop()
            conn = _running()
            why = _why_not_private()
        if why:
            _stop()
            raise DDPUsageError(refusal(why))
        try:
            conn.send(("host", master_addr, port))
            answered = conn.poll(ANSWER_S)
            reply = conn.recv() if answered else ("error", f"no answer within {ANSWER_S:g} s")
        except (EOFError, OSError) as exc:
            reply = ("error", f"the store host ended ({exc or 'pipe closed'})")
        if reply[0] != "ok":
            if not reply[1].startswith("%%ddp:"):
                _stop()  # the next launch starts a new host
                raise DDPUsageError(f"%%ddp: could not start the rendezvous store in the private "
                                 f"network: {reply[1]}")
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
    starter.ensure_forkserver()
    conn, child = ctx.Pipe(duplex=True)
    process = ctx.Process(target=serve, args=(child,), name="nbddp-stores", daemon=False)
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
    forkguard.hold(conn.fileno())  # a child the kernel forks must not keep the host alive
    forkguard.on_child(_host.clear)
    return conn


def _stop() -> None:
    conn, process = _host.pop("conn", None), _host.pop("process", None)
    _host.pop("net", None)
    _host.pop("why", None)
    if conn is not None:
        conn.close()
    if process is not None:
        if process.exitcode is None:
            process.kill()
        process.join(2)
