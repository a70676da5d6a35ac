"""The TCPStore server a launch's ranks meet at, on a socket nbddp binds itself: the one binding,
used by the kernel (nbddp/sources/rendezvous.py) and the store host (nbddp/forkserver/storehost.py);
torch is imported only when a store starts. Why bind it here: the store has no authentication, so
a local master address gets a socket on that loopback only (a non-local ``--master-addr`` listens
everywhere, as torch does); and ranks reaching the master over IPv4 get an IPv4 socket, not torch's
dual-stack one, so each accepted peer is ``127.0.0.1`` named from /etc/hosts, not
``::ffff:127.0.0.1`` by a DNS query that can stall every rank (docs/explanation/performance.md)."""
from __future__ import annotations

import functools
import ipaddress
import socket
from datetime import timedelta

from nbddp.core.errors import DDPUsageError


def host_store(master_addr: str, port: int | None, timeout_s: float = 1800.0):
    """Start a TCPStore server; returns (store, port). ``port=None`` picks a free one."""
    listener = None
    try:
        listener = _listener(master_addr, port or 0)
        store = _store_on(listener, master_addr, timeout_s) if listener is not None else None
        if store is None:
            store = _store_on(None, master_addr, timeout_s, port or 0)
    except (RuntimeError, OSError) as exc:
        if listener is not None and listener.fileno() >= 0:
            listener.close()
        text = str(exc)
        if port and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            raise DDPUsageError(  # the magic shows it as one line
                f"%%ddp: MASTER_PORT {port} is already in use on this machine (another job or "
                f"process holds it); choose another --master-port, or omit it to get a free one"
            ) from None
        raise DDPUsageError(f"%%ddp: could not start the rendezvous store on "
                         f"{master_addr}:{port or 'a free port'}: {text.splitlines()[0]}") from None
    return store, store.port


def _listener(master_addr: str, port: int) -> socket.socket | None:
    """The socket nbddp binds for the store, or None where torch's own listener serves."""
    sock = loopback_socket(master_addr, port)
    return sock if sock is not None else _ipv4_listener(master_addr, port)


def loopback_socket(master_addr: str, port: int) -> socket.socket | None:
    """A listening socket on the loopback address the ranks will connect to first, or None
    where ``master_addr`` is not (only) loopback."""
    found = loopback_addresses(master_addr, port)
    if not found:
        return None
    family, kind, proto, _, address = found[0]  # the address c10d's client tries first
    return _bound(socket.socket(family, kind, proto), address)


def loopback_addresses(master_addr: str, port: int) -> list:
    """getaddrinfo's answers for ``master_addr``, or [] where not all are loopback."""
    try:
        found = socket.getaddrinfo(master_addr, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return found if all(isinstance(info[4][0], str) and _is_loopback(info[4][0]) for info in found) else []


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=32)  # a launch must not add a name lookup of its own
def reaches_over_ipv4(master_addr: str) -> bool:
    """Whether torch's client will reach ``master_addr`` over IPv4: it resolves the name for
    IPv6 with v4-mapped results and connects to the first address; a v4-mapped one
    (``::ffff:a.b.c.d``) means the name has no IPv6 address. Where it has one, ranks connect
    over IPv6 and torch's own dual-stack listener serves them."""
    try:
        found = socket.getaddrinfo(master_addr, None, socket.AF_INET6, socket.SOCK_STREAM, 0,
                                   socket.AI_V4MAPPED | socket.AI_ALL)
    except (OSError, AttributeError):  # AttributeError: no AI_V4MAPPED on this platform
        return False
    return bool(found) and str(found[0][4][0]).startswith("::ffff:")


def _ipv4_listener(master_addr: str, port: int) -> socket.socket | None:
    """A listening IPv4 socket on all interfaces (as torch's own listener, for other nodes),
    or None where ranks will not come over IPv4."""
    if not reaches_over_ipv4(master_addr):
        return None
    return _bound(socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("0.0.0.0", port))


def _bound(sock: socket.socket, address) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _store_on(listener, master_addr: str, timeout_s: float, port: int = 0):
    """The TCPStore server, on ``listener`` (it then owns the socket) or on torch's own.
    None where this torch cannot take a listening socket (``master_listen_fd`` came in 2.4)."""
    from torch.distributed import TCPStore

    if listener is None:
        return TCPStore(master_addr, port, None, True, timedelta(seconds=timeout_s),
                        wait_for_workers=False)
    try:
        store = TCPStore(master_addr, listener.getsockname()[1], None, True,
                         timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=listener.fileno())
    except TypeError:  # no master_listen_fd here: the socket is still ours
        listener.close()
        return None
    listener.detach()  # the store owns the descriptor now (and closes it when it ends)
    return store
