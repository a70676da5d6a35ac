"""nbddp: run a Jupyter cell as torchrun-style ranked PyTorch distributed workers.

``%load_ext nbddp`` then ``%%ddp -n 4``; or ``nbddp.run(code_or_function, n=4)`` from Python.
"""
from __future__ import annotations

from .api import run
from .pool import Pool
from .result import DDPError, DDPTimeout, RankResult, RunResult
from .spec import LaunchSpec, make_spec, parse_line

__all__ = ["run", "backend", "Pool", "DDPError", "DDPTimeout", "RankResult", "RunResult", "LaunchSpec", "make_spec",
           "parse_line", "load_ipython_extension", "unload_ipython_extension"]
__version__ = "0.1.0"


def backend() -> str:
    """The backend this rank was launched for (``--backend``; auto: nccl with CUDA, else gloo).
    Outside nbddp (say, the same code under torchrun) the same rule is applied here."""
    from .worker import CURRENT

    if CURRENT.get("backend"):
        return CURRENT["backend"]
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def load_ipython_extension(ipython) -> None:
    from . import starter
    from .magic import DDPMagics, install_interrupt_line

    ipython.register_magics(DDPMagics)
    install_interrupt_line(ipython)
    starter.warm_up()


def unload_ipython_extension(ipython) -> None:
    pass
