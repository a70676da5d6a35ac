"""The rendezvous store the ranks meet at. As torchrun's agent does, the launcher hosts the
TCPStore itself (ranks see TORCHELASTIC_USE_AGENT_STORE=True), so a free port is bound with no
race and a port already in use is reported before any rank starts.

The store has no authentication, so when the master address is local (``localhost``,
``127.0.0.1``, ``::1``: every rank is on this machine) nbddp binds the listening socket to
that loopback address itself and hands it to the store: nobody on the network can reach it. A
non-local ``--master-addr`` (other nodes must connect) keeps torch's listen-on-every-interface.
"""
from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

from IPython.core.error import UsageError


def host_store(master_addr: str, port: int | None, timeout_s: float = 1800.0):
    """Start a TCPStore server; returns (store, port). ``port=None`` picks a free one."""
    from torch.distributed import TCPStore

    sock = None
    try:
        sock = loopback_socket(master_addr, port or 0)
        if sock is None:
            store = TCPStore(master_addr, port or 0, None, True, timedelta(seconds=timeout_s),
                             wait_for_workers=False)
        else:
            store = TCPStore(master_addr, sock.getsockname()[1], None, True,
                             timedelta(seconds=timeout_s), wait_for_workers=False,
                             master_listen_fd=sock.fileno())
            sock.detach()  # the store owns the socket now (and closes it when it ends)
    except (RuntimeError, OSError) as exc:
        if sock is not None and sock.fileno() >= 0:
            try:
                sock.close()
            except OSError:
                pass
        text = str(exc)
        if port and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            raise UsageError(  # IPython shows a UsageError (exactly that class) as one line
                f"%%ddp: MASTER_PORT {port} is already in use on this machine (another job or "
                f"process holds it); choose another --master-port, or omit it to get a free one"
            ) from None
        raise UsageError(f"%%ddp: could not start the rendezvous store on "
                         f"{master_addr}:{port or 'a free port'}: {text.splitlines()[0]}") from None
    return store, store.port


def loopback_socket(master_addr: str, port: int) -> socket.socket | None:
    """A listening socket on the loopback address the ranks will connect to first, or None
    where ``master_addr`` is not (only) loopback."""
    try:
        found = socket.getaddrinfo(master_addr, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    if not found or not all(_is_loopback(info[4][0]) for info in found):
        return None
    family, kind, proto, _, address = found[0]  # the address c10d's client tries first
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False
