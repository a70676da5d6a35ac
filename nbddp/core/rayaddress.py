"""Which Ray cluster a ``--launcher ray`` cell goes to: ``--ray-address``, else ``RAY_ADDRESS``,
else a local Ray started for the cell. Pure: the address read and split, not connected to
(nbddp/sources/ray.py checks it can be reached)."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

ENV_VAR = "RAY_ADDRESS"
CLIENT_PREFIX = "ray://"
CLIENT_PORT = 10001  # Ray Client's default
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$")


@dataclass(frozen=True)
class RayAddress:
    """The cluster a launch connects to: ``text`` as Ray takes it (None: a local Ray for the
    cell), where it came from, and the host and port to check (None for ``auto``)."""

    text: str | None
    origin: str = ""
    host: str | None = None
    port: int | None = None

    @property
    def local(self) -> bool:
        return self.text is None


def choose(flag: str | None, env: Mapping[str, str]) -> RayAddress:
    """The flag's address, else ``RAY_ADDRESS``'s, else None (a local Ray); a malformed one is a
    ValueError naming where it came from."""
    for text, origin in ((flag, "--ray-address"), (env.get(ENV_VAR), ENV_VAR)):
        if text is None or not text.strip():
            continue
        text = text.strip()
        if text == "local":
            return RayAddress(None, origin)
        if text == "auto":  # the cluster `ray start` last started on this machine
            return RayAddress(text, origin)
        rest = text[len(CLIENT_PREFIX):] if text.startswith(CLIENT_PREFIX) else text
        match = _HOST_PORT.match(rest)
        if not match:
            raise ValueError(f"{origin} takes HOST:PORT (the head's GCS, e.g. 10.0.0.1:6379), "
                             f"ray://HOST:PORT (Ray Client) or auto, got {text!r}")
        port = int(match.group(2)) if match.group(2) else (CLIENT_PORT if rest is not text else 6379)
        if not 1 <= port <= 65535:
            raise ValueError(f"{origin}: port must be between 1 and 65535, got {port}")
        return RayAddress(text, origin, match.group(1).strip("[]"), port)
    return RayAddress(None)
