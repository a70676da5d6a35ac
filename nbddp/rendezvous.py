"""The rendezvous store the ranks meet at. As torchrun's agent does, the launcher hosts the
TCPStore itself (ranks see TORCHELASTIC_USE_AGENT_STORE=True), so a free port is bound with no
race and a port already in use is reported before any rank starts."""
from __future__ import annotations

from datetime import timedelta

from IPython.core.error import UsageError


def host_store(master_addr: str, port: int | None, timeout_s: float = 1800.0):
    """Start a TCPStore server; returns (store, port). ``port=None`` picks a free one."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(master_addr, port or 0, None, True, timedelta(seconds=timeout_s),
                         wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        text = str(exc)
        if port and ("EADDRINUSE" in text or "address already in use" in text.lower()):
            raise UsageError(  # IPython shows a UsageError (exactly that class) as one line
                
                f"%%ddp: MASTER_PORT {port} is already in use on this machine (another job or "
                f"process holds it); choose another --master-port, or omit it to get a free one"
            ) from None
        raise UsageError(f"%%ddp: could not start the rendezvous store on "
                         f"{master_addr}:{port or 'a free port'}: {text.splitlines()[0]}") from None
    return store, store.port
