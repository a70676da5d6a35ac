"""Imported first by the forkserver, before torch: where the kernel asked for a private network
(``NBDDP_PRIVATE_NET=1``, nbddp/forkserver/privnet.py), enter it now, so everything the forkserver forks
(ranks, spares, the store host) is in it. Never raises (the forkserver must start): where it
cannot, the forkserver stays on the machine's network; the kernel has said why at %load_ext."""
from nbddp.forkserver import privnet

if privnet.requested():
    try:
        privnet.enter()
    except OSError:
        pass
