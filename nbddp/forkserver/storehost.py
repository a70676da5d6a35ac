"""The process that hosts the rendezvous stores inside the kernel's private network
(``NBDDP_PRIVATE_NET=1``, nbddp/forkserver/privnet.py). A TCPStore's master also connects to itself, so it
must live in the ranks' network namespace; the kernel cannot enter one (it has threads), so one
small process forked by the (private) forkserver hosts every launch's store on request, and
ends with the kernel (its pipe closes). Requests, one at a time over that pipe:
``("host", master_addr, port)`` → ``("ok", port)`` | ``("error", one line)``, and
``("drop", port)`` when the launch that used it has ended.
"""
from __future__ import annotations

import threading

from nbddp.core.errors import DDPUsageError

ANSWER_S = 30.0  # a TCPStore starts in milliseconds; past this the host is stuck

_lock = threading.Lock()
_host: dict = {}  # "conn", "process", "net" of the running host, once started


def serve(conn) -> None:
    """The host's loop (in a process forked by the forkserver): until the kernel goes away."""
    from nbddp.forkserver import privnet
    from nbddp.sources.rendezvous import host_store
    from nbddp.rank.worker import _set_name

    _set_name(b"nbddp-stores")
    stores = {}
    if privnet.entered():
        privnet.answer_names()
    conn.send(("ready", privnet.network_id()))
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
    """A store for one launch, hosted in the private network: (handle, port)."""
    with _lock:
        conn = _running()
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


def network() -> str | None:
    """The network namespace the stores (and so the ranks) are in; None before the first."""
    return _host.get("net")


def _running():
    """The host's pipe, starting the host first where needed (the caller holds ``_lock``)."""
    process = _host.get("process")
    if process is not None and process.exitcode is None:
        return _host["conn"]
    _stop()
    from nbddp.forkserver import starter

    ctx = starter.context("forkserver")
    starter.ensure_forkserver()
    conn, child = ctx.Pipe(duplex=True)
    process = ctx.Process(target=serve, args=(child,), name="nbddp-stores", daemon=False)
    starter.start(process)
    child.close()
    if not conn.poll(ANSWER_S):
        process.kill()
        raise DDPUsageError("%%ddp: the rendezvous store host did not start")
    _host.update(conn=conn, process=process, net=conn.recv()[1])
    return conn


def _stop() -> None:
    conn, process = _host.pop("conn", None), _host.pop("process", None)
    _host.pop("net", None)
    if conn is not None:
        conn.close()
    if process is not None:
        if process.exitcode is None:
            process.kill()
        process.join(2)
