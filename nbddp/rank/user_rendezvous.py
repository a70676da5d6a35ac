"""A cell's own rendezvous (its own MASTER_ADDR/MASTER_PORT, ``init_method="tcp://…"`` or
``"file://…"``, ``mp.spawn`` inside a rank) works in a rank as in a plain script. Each rank sees
TORCHELASTIC_USE_AGENT_STORE=True (as under torchrun), so torch's env:// and tcp:// handlers make
rank 0 a client too: right for nbddp's store only. So they are wrapped: elsewhere torch's plain
rule applies (rank 0 hosts), and a rendezvous that cannot work here fails at once in one line
naming the cell line; multiprocessing children get the same rule via a ``-c`` prefix. Loaded in the
forkserver and, by path, in those children: stdlib only at import, never CUDA, and the default
env:// path costs one dict lookup and a comparison."""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import linecache
import multiprocessing.util
import os
import re
import socket
import sys
from urllib.parse import parse_qs, urlparse

from nbddp.core.errors import NbddpError

FLAG = "TORCHELASTIC_USE_AGENT_STORE"
_MODULE = "torch.distributed.rendezvous"
# What this process was launched with: addr, port, cell; world_size, rank, pid in an nbddp rank only
# (a process it forks is not one of the launch's ranks)
LAUNCH: dict = {}


class RendezvousError(ValueError, NbddpError):
    """A cell's rendezvous that cannot work on this machine (raised before any wait)."""


def install(env: dict, cell_path: str | None) -> None:
    """In an nbddp rank, after its environment is set: remember the launch, wrap torch's
    handlers (now, or when torch.distributed is first imported) and multiprocessing's children."""
    LAUNCH.update(addr=env.get("MASTER_ADDR"), port=env.get("MASTER_PORT"),
                  world_size=env.get("WORLD_SIZE"), rank=env.get("RANK"), cell=cell_path,
                  pid=os.getpid())
    _hook()


def install_child(addr, port, cell_path) -> None:
    """In a process a rank started with multiprocessing: the same rule, without the world-size
    check (such a group legitimately has its own size)."""
    LAUNCH.update(addr=addr, port=port, world_size=None, cell=cell_path, pid=None)
    _hook()


def _hook() -> None:
    module = sys.modules.get(_MODULE)
    if module is not None:
        _wrap_handlers(module)
    elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())
    if not getattr(multiprocessing.util.spawnv_passfds, "_nbddp", False):
        multiprocessing.util.spawnv_passfds = _spawnv_with_hook(multiprocessing.util.spawnv_passfds)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps torch's handlers right after torch.distributed.rendezvous is imported (a child
    that never imports torch pays nothing)."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            original = loader.exec_module

            def exec_module(module):
                original(module)
                _wrap_handlers(module)

            loader.exec_module = exec_module
        return spec


def _wrap_handlers(module) -> None:
    handlers = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict):  # a torch without it: plain torchrun behaviour
        return
    for scheme in ("env", "tcp", "file"):
        handler = handlers.get(scheme)
        if handler is not None and not getattr(handler, "_nbddp", False):
            handlers[scheme] = _wrapped(scheme, handler)


def _wrapped(scheme: str, handler):
    def rendezvous_handler(url, *args, **kwargs):
        try:
            agent, rank0_port = _plan(scheme, url)
        except RendezvousError as exc:  # the traceback ends here, not in nbddp's helpers
            raise exc.with_traceback(None) from None
        except Exception:  # never break torch's own path: without a plan, torchrun's behaviour
            agent, rank0_port = True, None
        if agent:
            yield from handler(url, *args, **kwargs)
            return
        rendezvous = handler(url, *args, **kwargs)
        try:
            with _agent_store_off():
                first = next(rendezvous)
        except RuntimeError as exc:  # DistNetworkError included
            text = str(exc)
            if rank0_port and ("EADDRINUSE" in text or "address already in use" in text.lower()):
                mine = LAUNCH.get("rank") if LAUNCH.get("pid") == os.getpid() else "0"
                also = f" (perhaps another rank: this is rank {mine} of the launch, passing rank=0)"
                raise RendezvousError(f"port {rank0_port} ({_where(rank0_port, 'MASTER_PORT')}) is "
                                      f"held by another process on this machine"
                                      f"{also if mine != '0' else ''}") from None
            raise
        yield first
        yield from rendezvous

    rendezvous_handler._nbddp = True  # type: ignore[attr-defined]  # marks nbddp's wrapper (never wrapped twice)
    return rendezvous_handler


def _plan(scheme: str, url: str):
    """(use the agent store?, the port rank 0 will host on or None); raises RendezvousError
    for a rendezvous that cannot work here."""
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    size = query.get("world_size") or (os.environ.get("WORLD_SIZE") if scheme == "env" else None)
    launched = LAUNCH.get("world_size") if LAUNCH.get("pid") == os.getpid() else None
    if launched and size and size != launched:
        raise RendezvousError(f"world_size={size} ({_where(size, 'world_size', 'WORLD_SIZE')}) but "
                              f"this %%ddp launch has {launched} ranks")
    if scheme == "file":
        return True, None
    port: str | int | None
    if scheme == "env":
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    else:
        try:
            host, port = parsed.hostname, parsed.port
        except ValueError:
            return True, None  # torch reports a malformed URL itself
    if not host or port is None:
        return True, None  # torch's own "expected, but not set" error follows
    port = str(port)
    if (host, port) == (LAUNCH.get("addr"), LAUNCH.get("port")):
        return True, None  # nbddp's store: the default path, unchanged
    problem = _not_here(host)
    if problem:
        raise RendezvousError(f"MASTER_ADDR {host!r} ({_where(host, 'MASTER_ADDR', 'tcp://')}) {problem}")
    if port == LAUNCH.get("port"):
        return True, None  # nbddp's store under another local name
    rank = query.get("rank") or (os.environ.get("RANK") if scheme == "env" else None)
    return False, port if rank == "0" else None


@contextlib.contextmanager
def _agent_store_off():
    """torch's plain rule (rank 0 hosts) for this one store; torch reads the variable at
    exactly this point, and it is restored at once, so the rank's environment stays torchrun's."""
    saved = os.environ.get(FLAG)
    os.environ[FLAG] = "False"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(FLAG, None)
        else:
            os.environ[FLAG] = saved


def _not_here(host: str) -> str | None:
    """Why ``host`` is not an address of this machine (None if it is). Binding a UDP socket to
    each of its addresses asks the kernel without sending anything."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError):
        return "does not resolve"
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((address[0], 0))
            return None
        except OSError:
            continue
    resolved = infos[0][4][0]
    return "is not an address of this machine" + (f" ({resolved})" if resolved != host else "")


def _where(value, *names) -> str:
    """'set at cell line 5: os.environ["MASTER_PORT"] = "12355"' — the cell line that most
    likely set ``value``: one naming the variable and holding the value (as a whole token, so
    port 43123 does not match a 3), else one holding the value, else one naming the variable."""
    path = LAUNCH.get("cell")
    lines = linecache.getlines(path) if path else []
    token = re.compile(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])")
    found = [(i, text.strip()) for i, text in enumerate(lines, 1)
             if not text.lstrip().startswith("#")]
    for pick in (lambda t: token.search(t) and any(n in t for n in names),
                 lambda t: token.search(t), lambda t: any(n in t for n in names)):
        for number, text in found:
            if pick(text):
                return f"set at cell line {number}: {text}"
    return "set by the cell"


# ------------------------------------------------------------ multiprocessing children
_CHILD_PROGS = ("spawn_main", "forkserver import main")


def _spawnv_with_hook(spawnv):
    """multiprocessing starts spawn/forkserver children with ``python -c PROG``: put the hook
    in front of PROG, so such a child (a fresh interpreter) gets the same rule."""
    def spawnv_passfds(path, args, passfds):
        args = list(args)
        if "-c" in args[:-1]:
            at = args.index("-c") + 1
            if any(p in args[at] for p in _CHILD_PROGS):
                args[at] = _child_prefix() + args[at]
        return spawnv(path, args, passfds)

    spawnv_passfds._nbddp = True  # type: ignore[attr-defined]  # marks nbddp's wrapper (never wrapped twice)
    return spawnv_passfds


def _child_prefix() -> str:
    config = (LAUNCH.get("addr"), LAUNCH.get("port"), LAUNCH.get("cell"))
    return ("try:\n"
            " import importlib.util as _i\n"
            f" _s = _i.spec_from_file_location('nbddp_user_rendezvous', {os.path.abspath(__file__)!r})\n"
            " _m = _i.module_from_spec(_s); _s.loader.exec_module(_m)\n"
            f" _m.install_child(*{config!r}); del _i, _s, _m\n"
            "except Exception:\n"
            " pass\n")
