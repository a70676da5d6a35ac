"""The store nbddp hosts (nbddp/forkserver/tcpstore.py): where ranks come over IPv4 it listens on an IPv4
socket (so torch names each accepted rank from /etc/hosts, with no DNS query), else on torch's
own dual-stack socket; either way a real torch client reaches it."""
import datetime

import pytest
from torch.distributed import TCPStore

from nbddp.forkserver.tcpstore import host_store, reaches_over_ipv4


def _listening(port):
    """The /proc/net tables (tcp = IPv4, tcp6) with a listening socket on ``port``."""
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    found.append(table)
    return found


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "::1"])
def test_a_torch_client_reaches_the_store_on_the_family_it_uses(addr):
    store, port = host_store(addr, None)
    client = TCPStore(addr, port, None, False, datetime.timedelta(seconds=10))
    store.set("k", "v")
    assert client.get("k") == b"v"
    assert _listening(port) == (["tcp"] if reaches_over_ipv4(addr) else ["tcp6"])
    if addr == "127.0.0.1":
        assert reaches_over_ipv4(addr)
    if addr == "::1":
        assert not reaches_over_ipv4(addr)
