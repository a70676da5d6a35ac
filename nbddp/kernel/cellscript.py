"""The cell as the notebook's script: for each launch a hidden file beside the notebook (in the
ranks' working directory), so ``__file__``, ``sys.argv[0]``, ``inspect.getfile`` and what reads
them (hydra's ``config_path="."``, ``Path(__file__).parent / "data"``, multiprocessing's spawn
re-running ``__main__``) see what ``torchrun script.py`` run from the notebook's folder gives.

The file exists only while its launch runs: removed when the launch ends and, if the kernel dies
first, by the kernel's watcher (nbddp/kernel/janitor.py). The full copy stays in the log folder.
"""
from __future__ import annotations

import os

from nbddp.kernel import logdirs


def create(cwd: str, source: str) -> str | None:
    """Write ``source`` to a new hidden file in ``cwd`` and return its path; None where ``cwd``
    cannot take it (read-only), and the launch uses its log copy instead. Never replaces a
    file: a name in use (another launch of this kernel, or another kernel) is skipped."""
    stem = f".nbddp-{os.getpid()}"
    for attempt in range(100):
        path = os.path.join(cwd, f"{stem}{'-' + str(attempt) if attempt else ''}.py")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
        logdirs.remove_at_exit(path)  # (once per name) the kernel may die before remove() runs
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        return path
    return None


def remove(path: str | None) -> None:
    """The launch has ended: its script leaves the notebook's folder."""
    if path:
        try:
            os.remove(path)
        except OSError:
            pass
