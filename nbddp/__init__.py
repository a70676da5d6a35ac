"""nbddp: run a Jupyter cell as torchrun-style ranked PyTorch distributed workers.

``%load_ext nbddp`` then ``%%ddp -n 4``; or ``nbddp.run(code_or_function, n=4)`` from Python.
"""
from __future__ import annotations

import os

from nbddp.api import run
from nbddp.core.ddpline import parse_line
from nbddp.core.errors import DDPUsageError, NbddpError
from nbddp.core.launchrules import make_spec
from nbddp.core.result import DDPError, DDPTimeout, Interrupted, RankResult, RunResult
from nbddp.core.spec import LaunchSpec
from nbddp.forkserver.starter import ForkserverStuck
from nbddp.kernel.pulling import PullError
from nbddp.pool import Pool
from nbddp.rank.nostdin import NoDebugger, NoStdin
from nbddp.rank.release import Released
from nbddp.rank.user_rendezvous import RendezvousError

__all__ = ["run", "backend", "can_answer", "Pool", "RankResult", "RunResult", "LaunchSpec", "make_spec",
           "parse_line", "load_ipython_extension", "unload_ipython_extension",
           # every error a user can meet, all under NbddpError (nbddp/core/errors.py)
           "NbddpError", "DDPUsageError", "DDPError", "DDPTimeout", "PullError", "Interrupted",
           "ForkserverStuck", "RendezvousError", "NoStdin", "NoDebugger", "Released"]
__version__ = "0.1.0"


def backend() -> str:
    """The backend this rank was launched for (``--backend``; auto: nccl with a GPU for each of
    the node's ranks, else gloo). Outside nbddp (say, the same code under torchrun) the same rule
    is applied here, to torchrun's LOCAL_WORLD_SIZE."""
    from nbddp.core.placement import auto_backend
    from nbddp.rank.worker import CURRENT

    if CURRENT.get("backend"):
        return CURRENT["backend"]
    import torch

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return auto_backend(devices, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def can_answer() -> bool:
    """True where the front end running this cell can answer a rank's ``input()`` or debugger
    prompt (JupyterLab, Notebook, VS Code); False under papermill, nbclient, or outside a kernel,
    where ``breakpoint()`` in a rank fails at once (docs/howto/debugging.md)."""
    from nbddp.kernel.inputbox import InputBox

    return InputBox.for_this_cell() is not None


_hooks: list = []  # (event, callback) this extension registered with IPython


def load_ipython_extension(ipython) -> None:
    from nbddp.forkserver import starter, storehost
    from nbddp.kernel import frontend_probe
    from nbddp.magic import DDPMagics, install_interrupt_line
    from nbddp.views.startnote import StartNote

    ipython.register_magics(DDPMagics)
    install_interrupt_line(ipython)
    frontend_probe.probe(ipython)  # the first %%ddp cell then knows whether this front end renders widgets
    note = StartNote(storehost.torch_ready)
    starter.give_notes(note.show, note.clear)  # what the cell says while a new forkserver imports torch
    storehost.warm_up()
    _say_who_can_connect()
    # the next cells wait for the forkserver's import of torch and its store host, saying so
    _hooks[:] = [("pre_run_cell", note.wait_for_torch), ("post_run_cell", note.clear)]
    for event, hook in _hooks:
        ipython.events.register(event, hook)


def _say_who_can_connect() -> None:
    """Once, at %load_ext (docs/howto/jupyterhub.md): on a JupyterHub server, that the ranks
    got a private network and what it costs; where this machine gives none, what other local
    users can reach."""
    from nbddp.core.settings import PRIVATE_NET
    from nbddp.forkserver import privnet

    if privnet.given_by_auto():
        print(f"nbddp: on this JupyterHub server each launch's ranks run in a private network, so "
              f"other users of the machine cannot reach their rendezvous store or gloo listeners; "
              f"the ranks reach no other machine (no downloads in a rank, no remote "
              f"--master-addr): {PRIVATE_NET.name}=0 before %load_ext gives them the machine's network")
        return
    why = privnet.unavailable()
    if why and privnet.requested():  # NBDDP_PRIVATE_NET=1 by name: private or nothing
        print(f"nbddp: {PRIVATE_NET.name}=1, but this machine gives this kernel's ranks no private network "
              f"({why}): every launch will refuse to start; a new kernel with {PRIVATE_NET.name}=0 "
              f"runs them on the machine's network")
        return
    if why:
        print(f"nbddp: no private network for this kernel's ranks here ({why}): other users of "
              f"this machine can connect to each launch's rendezvous store and its ranks' gloo "
              f"listeners on loopback (logs and pushed values stay private); "
              f"see the docs' \"Teach a class on a JupyterHub\" (docs/howto/jupyterhub.md)")


def unload_ipython_extension(ipython) -> None:
    from nbddp.kernel import allcells

    allcells.off(ipython)
    for event, hook in _hooks:
        try:
            ipython.events.unregister(event, hook)
        except ValueError:
            pass
    _hooks.clear()
