"""Inside a pool rank: release a collective that hangs, keeping the rank and its Python state.

A gloo collective blocked in C ignores SIGINT, and ``ProcessGroup.abort()`` does not wake it;
what does is its connections closing. On the kernel's request (a byte on the rank's stack FIFO,
nbddp/rank/stackwatch.py) a thread shuts down this process's TCP connections to this machine's
addresses (the process group's pairs and its store; a connection to another host is left
alone), so the blocked call raises at once. The group is then unusable: the worker destroys it
before the next cell (``take``), and the cell that hung reports ``Released``."""
from __future__ import annotations

import ipaddress
import os
import socket

from nbddp.core.errors import NbddpError

REQUEST = b"!"  # the byte the kernel writes to ask for a release (a stack dump is b"?")
_released: list = []  # set by the FIFO thread, read by the main thread between cells


class Released(KeyboardInterrupt, NbddpError):
    """What a cell whose collective nbddp released raises (a KeyboardInterrupt: it stopped the
    cell as the stop button would have, had the rank been in Python code)."""


def release() -> int:
    """Shut down this process's TCP connections to local addresses; how many were shut."""
    _released.append(True)  # first: the main thread raises the moment a connection is shut
    shut, own = 0, _own_addresses()  # resolved once, not per socket
    for fd in _socket_fds():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and _local(sock.getpeername()[0], own):
                sock.shutdown(socket.SHUT_RDWR)  # the listener is not connected: getpeername fails
                shut += 1
        except OSError:
            pass
        finally:
            sock.close()  # the dup only; the shutdown holds for every descriptor of the socket
    return shut


def released() -> bool:
    return bool(_released)


def as_released(exc: BaseException, cell_path: str) -> BaseException:
    """The error a released collective raised, told as what it was (gloo says "Connection closed
    by peer … a remote worker crashing", which no rank did, and the SIGINT that came first may
    raise on top of it), with the cell's frames down to the line where it hung."""
    if not _released or not isinstance(exc, (RuntimeError, KeyboardInterrupt)):
        return exc
    tb, last = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == cell_path:
            last = tb
        tb = tb.tb_next
    if last is not None:
        last.tb_next = None  # torch's frames below the cell's line are not the user's
    released = Released("nbddp released this rank from a collective that did not return (the cell "
                        "was stopped); its process group is closed")
    released.__suppress_context__ = True
    return released.with_traceback(exc.__traceback__)


def take() -> bool:
    """Before the next cell: destroy the closed default process group (so
    ``dist.init_process_group`` works again) and forget the release; True if there was one."""
    if not _released:
        return False
    _released.clear()
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass  # a group that cannot even be destroyed: init_process_group will say so
    return True


def _socket_fds() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except (OSError, ValueError):
            pass
    return fds


def _local(address: str, own: set[str]) -> bool:
    """Loopback, or one of this machine's own addresses (a pool's ranks all run here)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    return address in own


def _own_addresses() -> set[str]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}
