"""The rendezvous store of a launch (fresh or a pool). As torchrun's agent does, the launcher hosts
the TCPStore itself (ranks see TORCHELASTIC_USE_AGENT_STORE=True), so a free port is bound with
no race and a port already in use is reported before any rank starts. It is hosted by a process
of the forkserver's (nbddp/forkserver/storehost.py), never in the kernel, which so never imports
torch; how it is bound: nbddp/forkserver/tcpstore.py.
"""
from __future__ import annotations

from nbddp.core import settings
from nbddp.core.launchrules import check_private_net
from nbddp.forkserver import privnet, storehost
from nbddp.forkserver.tcpstore import loopback_addresses


def host_for(spec):
    """The store for a launch of ``spec`` (fresh or a pool): (handle, port). With a private
    network (``NBDDP_PRIVATE_NET=1``, nbddp/forkserver/privnet.py) the ranks live in it, and so
    does the store host: the ranks can reach nothing else."""
    if privnet.requested():
        check_private_net(spec, settings.PRIVATE_NET.name,
                          master_is_loopback=bool(loopback_addresses(spec.master_addr, 0)))
    return storehost.host(spec.master_addr, spec.master_port)
