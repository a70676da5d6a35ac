"""A private network for a kernel's ranks: a Linux network namespace whose loopback no other process
of the machine shares. ``NBDDP_PRIVATE_NET=1`` asks for it, ``0`` refuses it, unset (``auto``)
gives it on a JupyterHub single-user server (``JUPYTERHUB_USER``) where the machine allows it.
Why: the rendezvous store and gloo's listeners take any connection from any local user, and TCP
cannot say who connects; a loopback of their own keeps them to one user without changing the
ranks' environment. The forkserver enters it (through a user namespace mapping its own ids when
unprivileged) before it imports anything, so all it forks lives there. Stdlib only; fails closed
(nbddp/forkserver/storehost.py)."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import socket
import struct
import subprocess
import sys
import threading

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
SIOCGIFADDR, SIOCSIFADDR, SIOCSIFNETMASK = 0x8915, 0x8916, 0x891C

_probed: dict[str, str] = {}


HUB = "JUPYTERHUB_USER"  # set by JupyterHub in every single-user server it spawns
_decide_lock = threading.Lock()


def requested() -> bool:
    """This kernel's ranks get a private network; decided once per process. ``auto`` (unset) is
    decided in the kernel, before its forkserver starts, and written back to the environment
    as ``1`` or ``0``, so the forkserver (which inherits it) reads the same answer."""
    from nbddp.core import settings  # here: the rest of this file runs alone (the probe, stdlib only)

    with _decide_lock:
        if "asked" not in _probed:
            value = str(settings.read(settings.PRIVATE_NET))
            _probed["how"] = "by name" if value in ("0", "1") else "auto"
            if value not in ("0", "1"):
                value = "1" if on_a_hub() and not unavailable() else "0"
                os.environ[settings.PRIVATE_NET.name] = value
            _probed["asked"] = "1" if value == "1" else ""
    return bool(_probed["asked"])


def on_a_hub() -> bool:
    """A JupyterHub single-user server: other users of the machine are the rest of the class."""
    return bool(os.environ.get(HUB))


def given_by_auto() -> bool:
    """The private network was not asked for by name but given by ``auto`` (said at %load_ext)."""
    return requested() and _probed.get("how") == "auto"


def enter() -> None:
    """Move this (single-threaded) process into a new network namespace with its loopback up,
    carrying this machine's IPv4 addresses and name servers' addresses there (see
    ``_carry_addresses``). Raises OSError saying why not."""
    uid, gid = os.geteuid(), os.getegid()
    carried = _machine_addresses() + [a for a in nameservers() if not a.startswith("127.")]
    if _unshare(CLONE_NEWNET) != 0:  # root (CAP_SYS_ADMIN) needs nothing more
        threads = _threads()
        if _unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL and threads > 1:  # the kernel refuses a threaded process
                raise OSError(err, f"this Python process had {threads} threads before nbddp could "
                                   f"enter one (a sitecustomize or .pth file, or a module imported "
                                   f"at startup, started a thread), and a user namespace needs a "
                                   f"single-threaded process")
            raise OSError(err, f"unprivileged user and network namespaces are not allowed here "
                               f"(unshare: {os.strerror(err)})")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _loopback_up()
    _carry_addresses(carried)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _machine_addresses() -> list[str]:
    """This machine's IPv4 addresses, but loopback's."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s, SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            address = socket.inet_ntoa(raw[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return found


def _carry_addresses(addresses: list[str]) -> None:
    """Put ``addresses`` on the private loopback (each a /32), so what ranks did with them
    outside still works inside: gloo binds to the address this machine's name resolves to
    (else it falls back to loopback with a warning on every rank), and each name server's
    address gets an answer at once (``answer_names``) instead of "Temporary failure in name
    resolution", which c10d prints as a warning for every connection it names."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i, address in enumerate(addresses):
            label = f"lo:{i + 1}".encode()
            where = struct.pack("16sH2s4s8s", label, socket.AF_INET, b"\0\0", socket.inet_aton(address), b"")
            mask = struct.pack("16sH2s4s8s", label, socket.AF_INET, b"\0\0", b"\xff\xff\xff\xff", b"")
            try:
                fcntl.ioctl(s, SIOCSIFADDR, where)
                fcntl.ioctl(s, SIOCSIFNETMASK, mask)
            except OSError:
                pass  # that name or address then behaves as with no network at all


def nameservers() -> list[str]:
    """The IPv4 name servers /etc/resolv.conf names."""
    try:
        with open("/etc/resolv.conf") as f:
            words = [line.split() for line in f]
    except OSError:
        return []
    return [w[1] for w in words if len(w) > 1 and w[0] == "nameserver" and _is_ipv4(w[1])]


def _is_ipv4(text: str) -> bool:
    try:
        socket.inet_aton(text)
        return text.count(".") == 3
    except OSError:
        return False


def answer_names() -> None:
    """In the private network, answer every DNS query on the name servers' addresses with
    "no such name" (a daemon thread): a lookup ends at once, as it would on a machine whose
    DNS knows no such name, and getnameinfo() falls back to the number, as outside."""
    sockets = []
    for address in nameservers():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((address, 53))
            sockets.append(sock)
        except OSError:
            sock.close()
    if sockets:
        threading.Thread(target=_no_such_name, args=(sockets,), name="nbddp-names", daemon=True).start()


def _no_such_name(sockets) -> None:
    while True:
        for sock in select.select(sockets, [], [])[0]:
            try:
                query, peer = sock.recvfrom(512)
                sock.sendto(nxdomain(query), peer)
            except OSError:
                continue


def nxdomain(query: bytes) -> bytes:
    """The NXDOMAIN answer to a DNS query: its id and question, no records."""
    if len(query) < 12:
        return b""
    end = 12
    while end < len(query) and query[end]:
        end += 1 + query[end]
    question = query[12:end + 5]
    flags = 0x8000 | (query[2] & 0x01) << 8 | 0x0080 | 3  # response, RD echoed, RA, NXDOMAIN
    return query[:2] + struct.pack(">HHHHH", flags, 1 if question else 0, 0, 0, 0) + question


def _unshare(flags: int) -> int:
    return ctypes.CDLL(None, use_errno=True).unshare(flags)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        name = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, name))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def network_id(pid: int | str = "self") -> str:
    """The network namespace a process is in (``net:[4026531840]``)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def unavailable() -> str:
    """Why this machine gives this user no private network ("" where it does), tried once per
    kernel in a short-lived process (the kernel itself has threads and must stay put) started
    as multiprocess starts the forkserver: the same interpreter and flags, with ``site`` (a
    ``sitecustomize`` or ``.pth`` file that starts a thread makes a user namespace fail there
    too; ``python -I -S`` said yes where the forkserver then could not), the kernel's sys.path,
    and the forkserver's first import (the nbddp package) before it tries."""
    if "why" not in _probed:
        _probed["why"] = _probe()
    return _probed["why"]


PROBE_S = 20.0


def _probe() -> str:
    code = (f"import sys; sys.path[:] = {[p or os.getcwd() for p in sys.path]!r}; "
            f"from nbddp.forkserver import privnet; privnet.probe_main()")
    # the interpreter's own -X/-W/-O flags for a child, as multiprocessing passes them (private: no stub)
    command = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", code]  # type: ignore[attr-defined]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the probe could not run: {exc}"
    if done.returncode == 0:
        return ""
    return (done.stderr.strip().splitlines() or [f"the probe failed (exit code {done.returncode})"])[-1]


def probe_main() -> None:
    """The probe's body: can this process, started as the forkserver is, enter one?"""
    try:
        enter()
    except Exception as exc:  # the one line the kernel shows
        sys.exit(str(getattr(exc, "strerror", None) or exc))
    sys.exit(0)
