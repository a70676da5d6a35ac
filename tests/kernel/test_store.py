"""The rendezvous store in a real kernel: with a local master address it listens on loopback
only (nobody on the network can read or write its keys); a non-local --master-addr keeps it
reachable from other nodes."""
import re
import socket

import psutil
import pytest

CELL = ("import os, time, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "print('PORT', os.environ['MASTER_PORT'], flush=True)\ntime.sleep(2)\ndist.barrier()")


def _external_ipv4():
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return None


def _run_and_inspect(kernel, line, external):
    """Run the cell; while its ranks sleep, see what listens at MASTER_PORT: the forkserver's
    store host (nbddp/forkserver/storehost.py), under the kernel."""
    seen = {}

    def look(reply):
        match = re.search(r"PORT (\d+)", reply.stdout)
        if match and not seen:
            seen.update(_inspect(kernel.pid, int(match.group(1)), external))

    reply = kernel.execute(f"%%ddp -n 2 --output text {line}\n{CELL}", on_output=look)
    assert reply.status == "ok" and not reply.error, reply.text  # the cell still works
    return seen


def test_store_listens_on_loopback_only_for_a_local_master(kernel):
    external = _external_ipv4()
    seen = _run_and_inspect(kernel, "", external)
    assert seen["listen"] and all(ip in ("127.0.0.1", "::1") for ip in seen["listen"]), seen
    if external:  # someone on the network: refused
        assert seen["external"] != 0, seen


def test_non_local_master_addr_stays_reachable(kernel):
    external = _external_ipv4()
    if external is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    seen = _run_and_inspect(kernel, f"--master-addr {external}", external)
    assert seen["external"] == 0, seen  # other nodes can connect


def _inspect(pid, port, external):
    kernel = psutil.Process(pid)
    found = {"listen": sorted({c.laddr.ip for p in [kernel] + kernel.children(recursive=True)
                               for c in _connections(p)
                               if c.status == psutil.CONN_LISTEN and c.laddr.port == port})}
    if external:
        probe = socket.socket()
        probe.settimeout(2)
        found["external"] = probe.connect_ex((external, port))  # 0: connected
        probe.close()
    return found


def _connections(process):
    try:
        return process.net_connections("inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
