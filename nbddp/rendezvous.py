"""The rendezvous store the ranks meet at. As torchrun's agent does, the launcher hosts the
TCPStore itself (ranks see TORCHELASTIC_USE_AGENT_STORE=True), so a free port is bound with no
race and a port already in use is reported before any rank starts.

Where ranks reach the master address over IPv4 (it has no IPv6 address, as ``localhost`` where
/etc/hosts lists only 127.0.0.1), the store listens on an IPv4 socket nbddp binds itself, not on
torch's dual-stack ``::`` socket: torch names every accepted peer with
``getnameinfo()`` without ``NI_NUMERICHOST``, and for a dual-stack socket the peer is
``::ffff:127.0.0.1``, which no ``/etc/hosts`` lists, so each rank's connection cost a DNS query
in the store's single server thread; where the DNS server drops a packet that is glibc's 5 s
resolver timeout, and every rank of the launch waits it out. With an IPv4 socket the peer is
``127.0.0.1`` (``localhost`` in ``/etc/hosts``): no query. README "Benchmarks" has the evidence.
"""
from __future__ import annotations

import functools
import socket
from datetime import timedelta

from IPython.core.error import UsageError


@functools.lru_cache(maxsize=32)  # a launch must not add a name lookup of its own
def reaches_over_ipv4(master_addr: str) -> bool:
    """Whether torch's client will reach ``master_addr`` over IPv4: it resolves the name for
    IPv6 with v4-mapped results and connects to the first address; a v4-mapped one
    (``::ffff:a.b.c.d``) means the name has no IPv6 address. Where it has one (``::1
    localhost`` in /etc/hosts), ranks connect over IPv6 and torch's own listener serves them."""
    try:
        found = socket.getaddrinfo(master_addr, None, socket.AF_INET6, socket.SOCK_STREAM, 0,
                                   socket.AI_V4MAPPED | socket.AI_ALL)
    except (OSError, AttributeError):  # AttributeError: no AI_V4MAPPED on this platform
        return False
    return bool(found) and found[0][4][0].startswith("::ffff:")


def _ipv4_listener(master_addr: str, port: int | None) -> socket.socket | None:
    """A bound IPv4 socket on all interfaces (as torch's own listener), or None where ranks
    will not come over IPv4 (torch's dual-stack listener is used then)."""
    if not reaches_over_ipv4(master_addr):
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's listener does
        sock.bind(("0.0.0.0", port or 0))
    except OSError as exc:
        sock.close()
        raise RuntimeError(str(exc)) from None
    return sock


def host_store(master_addr: str, port: int | None, timeout_s: float = 1800.0):
    """Start a TCPStore server; returns (store, port). ``port=None`` picks a free one."""
    try:
        listener = _ipv4_listener(master_addr, port)
        store = None
        if listener is not None:
            store = _store_on(listener, master_addr, timeout_s)
        if store is None:
            store = _store_on(None, master_addr, timeout_s, port or 0)
    except (RuntimeError, OSError) as exc:
        text = str(exc)
        if port and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            raise UsageError(  # IPython shows a UsageError (exactly that class) as one line
                f"%%ddp: MASTER_PORT {port} is already in use on this machine (another job or "
                f"process holds it); choose another --master-port, or omit it to get a free one"
            ) from None
        raise UsageError(f"%%ddp: could not start the rendezvous store on "
                         f"{master_addr}:{port or 'a free port'}: {text.splitlines()[0]}") from None
    return store, store.port


def _store_on(listener, master_addr: str, timeout_s: float, port: int = 0):
    """The TCPStore server, on ``listener`` (it then owns the socket) or on torch's own.
    None where this torch cannot take a listening socket (``master_listen_fd`` came in 2.4)."""
    from torch.distributed import TCPStore

    if listener is None:
        return TCPStore(master_addr, port, None, True, timedelta(seconds=timeout_s),
                        wait_for_workers=False)
    port = listener.getsockname()[1]
    try:
        store = TCPStore(master_addr, port, None, True, timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=listener.fileno())
    except TypeError:  # no master_listen_fd here: the socket is still ours
        listener.close()
        return None
    finally:
        if listener.fileno() != -1:
            listener.detach()  # torch owns the descriptor now (it closes it with the store)
    return store
