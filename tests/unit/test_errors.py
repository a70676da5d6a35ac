"""One error base: every error a user can meet from nbddp is an ``nbddp.NbddpError`` and is
exported from ``nbddp``, each keeping the builtin base Python code expects (a usage error is a
ValueError, a failed launch a RuntimeError, the stop button a KeyboardInterrupt and so not an
Exception)."""
from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

import nbddp
from nbddp.core.errors import NbddpError

ROOT = pathlib.Path(nbddp.__file__).parent
# raised and caught inside one module, never seen by a user
INTERNAL = {"nbddp.rank.asking._NotFirst", "nbddp.core.ddpline._HelpShown"}


def _error_classes():
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.endswith(("serve", "serve_private_net")):  # enter the forkserver's state on import
            continue
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{name}.{cls_name}"] = cls
    return found


ERRORS = _error_classes()


def test_every_error_a_user_can_meet_is_an_nbddp_error_exported_from_nbddp():
    public = {k: v for k, v in ERRORS.items() if k not in INTERNAL}
    assert public
    assert [k for k, v in public.items() if not issubclass(v, NbddpError)] == []
    names = {k: k.rpartition(".")[2] for k in public}  # Interrupted calls itself KeyboardInterrupt
    kinds_of_stuck = {k for k, v in public.items()
                      if v is not nbddp.ForkserverStuck and issubclass(v, nbddp.ForkserverStuck)}
    missing = [k for k in public if k not in kinds_of_stuck
               and (getattr(nbddp, names[k], None) is not public[k] or names[k] not in nbddp.__all__)]
    assert missing == [] and "NbddpError" in nbddp.__all__


def test_each_keeps_the_builtin_base_python_code_expects():
    assert issubclass(nbddp.DDPUsageError, ValueError) and issubclass(nbddp.RendezvousError, ValueError)
    assert issubclass(nbddp.DDPError, RuntimeError) and issubclass(nbddp.PullError, nbddp.DDPError)
    assert issubclass(nbddp.NoStdin, EOFError) and issubclass(nbddp.NoDebugger, RuntimeError)
    assert issubclass(nbddp.Interrupted, KeyboardInterrupt) and not issubclass(nbddp.Interrupted, Exception)
    assert not issubclass(NbddpError, Exception)  # else an interrupt would be one
    with pytest.raises(ValueError):
        nbddp.make_spec(n=0)
