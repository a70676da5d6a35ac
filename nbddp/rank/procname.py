"""The name ``ps -o comm``, ``top`` and psutil show for an nbddp process (Linux): ``nbddp-rankN``,
``nbddp-spare``, ``nbddp-stores``. Here, on the rank side, because ranks and spares name
themselves; the forkserver's store host (nbddp/forkserver/storehost.py) uses it too."""
from __future__ import annotations

import ctypes

_LIBC: ctypes.CDLL | None
try:  # loaded once, in the forkserver
    _LIBC = ctypes.CDLL(None)
except Exception:  # pragma: no cover - not Linux
    _LIBC = None

PR_SET_NAME = 15


def set_name(name: bytes) -> None:
    """Name this process (at most 15 bytes are kept); never raises."""
    try:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_NAME, name, 0, 0, 0)
    except Exception:
        pass
