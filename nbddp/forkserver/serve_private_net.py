"""Imported first by the forkserver, before torch: where the kernel asked for a private network
(``NBDDP_PRIVATE_NET=1``, nbddp/forkserver/privnet.py), enter it now, so everything the forkserver forks
(ranks, spares, the store host) is in it. The forkserver must start either way (multiprocess
would start a new one for each fork request, each failing the same), so where it cannot enter
one it records why (nbddp/rank/netrecord.py, as it records having entered): the store host reports it and the kernel
refuses every launch in one line saying why (fail closed), and a rank forked from it refuses to run."""
from nbddp.forkserver import privnet
from nbddp.rank import netrecord

if privnet.requested():
    try:
        privnet.enter()
    except Exception as exc:  # recorded, never lost: see the docstring
        netrecord.failed(f"the forkserver could not enter one: "
                         f"{getattr(exc, 'strerror', None) or exc or type(exc).__name__}")
    else:
        netrecord.entered()
