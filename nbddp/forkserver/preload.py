"""What the forkserver imports before it forks a rank (``MODULES``: the one list, with reasons), and
the notebook's modules offered to it after each cell, so a rank's first ``DDP(...)`` or ``import
transformers`` costs nothing (docs/explanation/performance.md). Nothing here initialises CUDA:
the forkserver must stay fork-safe. Offers (``NBDDP_PRELOAD=0``: none) come with no signal handler
(one runs inside ``os.fork``'s hooks too): a messenger writes the names into a pipe, the
forkserver's before-fork hook reads it in its main loop and imports those a forked probe imported
without failing, starting a thread or touching CUDA; the next messenger carries the verdicts
back. A user module whose file changed is dropped in the ranks (``stale()``), as under torchrun."""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import sysconfig
import threading
import time

from nbddp.core import settings

# (module, why it is preloaded). Order matters only for speed.
MODULES = [
    ("torch", "every cell; ~2 s to import"),
    ("torch.distributed", "init_process_group, collectives, the TCPStore client"),
    ("torch.nn", "models"),
    ("torch.nn.parallel", "DistributedDataParallel"),
    ("torch.optim", "optimizers and lr_scheduler"),
    ("torch._dynamo", "imported by the first optimizer.step(), DDP(...) and torch.profiler: "
                      "4.4-6.2 s and ~820 modules per rank on 2 cores"),
    ("torch.amp", "autocast, GradScaler"),
    ("torch.utils.data", "DataLoader"),
    ("torch.utils.data.distributed", "DistributedSampler"),
    ("torch.distributed.fsdp", "fully_shard (FSDP2): 605 modules, 2.4 s, mostly torch._dynamo's"),
    ("torch.distributed.checkpoint", "dcp.save / dcp.load: 74 modules more than torch._dynamo's"),
    ("torch.profiler", "torch.profiler.profile"),
    ("torch.profiler._cupti_monitor", "imported by the profiler hooks of the first optimizer "
                                      "step and DataLoader iteration (no CUDA call at import)"),
    ("torch.utils.serialization", "the first torch.save / torch.load"),
    ("nbddp.rank.worker", "the rank's own code"),
    ("nbddp.rank.display", "display() / plt.show() in a rank"),
    ("nbddp.forkserver.serve", "lets the kernel send the notebook's modules later (this module)"),
]
NAMES = [name for name, _ in MODULES]

PROBE_TIMEOUT_S = 120.0

# Never offered: the kernel's own stack (a rank has no kernel), test tools, and what the
# forkserver has anyway (nbddp, torch and their own dependencies).
KERNEL_STACK = frozenset("""
IPython ipykernel ipyparallel ipywidgets widgetsnbextension jupyterlab_widgets comm zmq tornado
traitlets jupyter_client jupyter_core jupyter_server jupyterlab notebook nbclient nbformat
papermill debugpy pydevd pydev_ipython pydevconsole pydevd_file_utils pydevd_plugins
pydevd_tracing matplotlib_inline prompt_toolkit pygments jedi parso wcwidth pexpect ptyprocess
decorator pickleshare backcall stack_data executing asttokens pure_eval nest_asyncio psutil
platformdirs dateutil packaging typing_extensions pytest pluggy iniconfig playwright
nbddp multiprocess dill torch accelerate
""".split())
# C extensions known to start threads at import (the probe also checks every module).
THREAD_STARTERS = frozenset({"tensorflow", "ray", "grpc", "jax", "jaxlib"})


def enabled() -> bool:
    return bool(settings.read(settings.PRELOAD))


# ----------------------------------------------------------------- kernel side
def _in_notebook() -> bool:
    """Only a notebook's (IPython's) imports are offered: a plain script or test runner calling
    nbddp.run() has imported its own machinery (pytest and its plugins), which no rank wants."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


_offered: dict[str, str] = {}   # name -> verdict from the forkserver ("ok", or why not)
_files: dict[str, float] = {}   # preloaded user-module file -> its mtime then
_lock = threading.Lock()        # the spares' refill thread writes both while a launch reads them


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")
                  if k in paths})


def notebook_modules(modules=None) -> list[str]:
    """Modules the notebook imported that are worth offering and were not offered yet, in
    import order (packages before their submodules); ``modules`` is ``sys.modules``-like."""
    modules = sys.modules if modules is None else modules
    names = []
    for name, mod in list(modules.items()):
        root = name.split(".")[0]
        if (root in KERNEL_STACK or root in THREAD_STARTERS or root.startswith("_")
                or root in sys.stdlib_module_names or root in sys.builtin_module_names
                or name == "__main__" or name in _offered):
            continue
        if not isinstance(getattr(mod, "__file__", None), str):
            continue  # namespace packages, modules made at run time, the notebook itself
        names.append(name)
    return names


def offer(ctx, start) -> bool:
    """Send the forkserver the notebook's new modules (blocking, with deadlines; run from the
    spares' refill thread). True when it imported any: processes forked before lack them."""
    if not enabled() or not _in_notebook():
        return False
    names = notebook_modules()
    if not names:
        return False
    path = [p or os.getcwd() for p in sys.path]
    token = os.urandom(8).hex()  # the verdicts for this offer, not an earlier one
    poster = ctx.Process(target=post, args=(token, names, path), name="nbddp-preload")
    start(poster)
    poster.join(10)
    if poster.exitcode is None:
        poster.kill()
        poster.join(5)
    verdicts = {}
    if poster.exitcode == 0:  # the offer waits in the forkserver's pipe: the next fork takes it
        parent, child = ctx.Pipe(duplex=False)
        messenger = ctx.Process(target=deliver, args=(token, child), name="nbddp-preload")
        start(messenger)
        child.close()
        try:
            if parent.poll(10):
                verdicts = parent.recv()
        except (EOFError, OSError):
            pass
        finally:
            parent.close()
            messenger.join(5)
            if messenger.exitcode is None:
                messenger.kill()
                messenger.join(5)
    if not verdicts:  # no answer (a forkserver without the hook, no /proc): do not ask again
        verdicts = {name: "not preloaded: the forkserver did not answer" for name in names}
    with _lock:
        for name, verdict in verdicts.items():
            if verdict in ("ok", "present"):
                _offered[name] = "ok"
                _remember_file(sys.modules.get(name))
            elif verdict != "not tried":
                _offered[name] = verdict
    return "ok" in verdicts.values()


def _remember_file(mod) -> None:
    """Files of the user's own modules (outside site-packages and the stdlib), to see edits."""
    path = getattr(mod, "__file__", None)
    if not isinstance(path, str):
        return
    real = os.path.realpath(path)
    if real.startswith(_library_dirs()):
        return
    try:
        _files[real] = os.stat(real).st_mtime
    except OSError:
        pass


def stale() -> list[str]:
    """Preloaded modules whose file changed since: a rank drops them (and their submodules)
    from ``sys.modules``, so the cell imports what is on disk now."""
    with _lock:
        files, offered = dict(_files), dict(_offered)
    changed = set()
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime != mtime:
                changed.add(path)
        except OSError:
            changed.add(path)
    if not changed:
        return []
    names = [name for name, mod in list(sys.modules.items())
             if offered.get(name) == "ok"
             and isinstance(file := getattr(mod, "__file__", None), str)
             and os.path.realpath(file) in changed]
    return names


# ------------------------------------------------------------ forkserver side
_channel: tuple[int, int] | None = None   # the pipe offers arrive on (forkserver only)
_busy = False
_verdicts: dict[str | None, dict] = {}    # offer token -> verdicts, inherited by the next messenger


def serve() -> None:
    """In the forkserver (nbddp/forkserver/serve.py): take offers in a before-fork hook, which runs
    in the forkserver's main loop just before it forks (never in a signal handler). Children
    do not get the pipe (os.register_at_fork), so a rank is untouched."""
    global _channel
    if _channel is not None:
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    _channel = (r, w)
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def _in_child() -> None:
    global _busy
    _busy = True  # a child never takes offers (a probe forked from the hook, a rank)
    if _channel is not None:
        for fd in _channel:
            try:
                os.close(fd)
            except OSError:
                pass


def _before_fork() -> None:
    """Just before the forkserver forks: handle every offer waiting in the pipe. Never raises
    (an exception here would fail the fork); the probe's own fork does not re-enter."""
    global _busy
    if _busy or _channel is None:
        return
    _busy = True
    try:
        while True:
            try:
                data = os.read(_channel[0], 1 << 20)
            except BlockingIOError:
                break
            if not data:
                break
            for line in data.splitlines():
                try:
                    _take(json.loads(line))
                except Exception:
                    pass
    except Exception:
        pass
    finally:
        _busy = False


def _take(offer: dict) -> None:
    global _verdicts
    for entry in offer.get("path", []):
        if entry not in sys.path:
            sys.path.append(entry)
    names = [n for n in offer["names"] if n not in sys.modules]
    verdicts = {n: "present" for n in offer["names"] if n in sys.modules}
    if names:
        probed = _probe(names)
        verdicts.update(probed)
        for name in names:
            if probed.get(name) == "ok":
                try:
                    __import__(name)
                except BaseException as exc:  # the forkserver must go on
                    verdicts[name] = f"failed here: {type(exc).__name__}"
    _verdicts = {offer.get("token"): verdicts}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _touched_cuda() -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(torch, "cuda", None), "_initialized", False):
        return True
    try:
        with open("/proc/self/maps") as f:
            return "libcuda.so" in f.read()
    except OSError:
        return False


def _probe(names: list[str]) -> dict[str, str]:
    """Import ``names`` one by one in a forked child; the verdict for each: "ok", why not, or
    "not tried" (after the first unsafe one, the child's state proves nothing more)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe
        verdicts = {}
        try:
            os.close(r)
            for i, name in enumerate(names):
                threads, cuda = _threads(), _touched_cuda()
                try:
                    __import__(name)
                except BaseException as exc:
                    verdicts[name] = f"import failed: {type(exc).__name__}: {str(exc)[:100]}"
                    continue
                why = ("started a thread" if _threads() > threads else
                       "touched CUDA" if _touched_cuda() and not cuda else None)
                if why:
                    verdicts[name] = f"not preloaded: its import {why}"
                    verdicts.update({n: "not tried" for n in names[i + 1:]})
                    break
                verdicts[name] = "ok"
            os.write(w, json.dumps(verdicts).encode())
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + PROBE_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)  # reaped here, so the forkserver's loop never sees an unknown pid
    try:
        return json.loads(data)
    except ValueError:
        return {n: "not preloaded: the probe did not finish" for n in names}


def post(token: str, names: list[str], path: list[str]) -> None:
    """The first messenger (forked from the forkserver): leave the offer in its parent's pipe.
    Exits 0 when it did."""
    if _channel is None:  # the forkserver's state, inherited by this fork
        os._exit(1)
    offer = json.dumps({"token": token, "names": names, "path": path})
    try:
        fd = os.open(f"/proc/{os.getppid()}/fd/{_channel[1]}", os.O_WRONLY)  # closed in this child
        try:
            os.write(fd, (offer + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        os._exit(1)
    os._exit(0)


def deliver(token: str, conn) -> None:
    """The second messenger: its fork ran the forkserver's hook, which took the offer; the
    verdicts are in this process's copy of the forkserver's memory. Pass them to the kernel."""
    try:
        conn.send(dict(_verdicts.get(token, {})))
    finally:
        conn.close()
