"""Many users on one server (nbddp/forkserver/privnet.py, nbddp/forkserver/storehost.py): another local user
(``nobody``, via runuser, as root) tries what a classmate could. By default it can connect to a launch's store (the
exposure docs/explanation/reliability.md states); with ``NBDDP_PRIVATE_NET=1`` neither it nor anyone outside the
kernel's private network reaches the store or the ranks' gloo listeners, while the owner's cells run normally. Logs and
pushed values are private either way."""
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

import support
from support.helpers import alive, wait_gone, wait_until
from support.kernel import Kernel

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None
                                or not os.path.exists("/usr/bin/python3"),
                                reason="needs root (to act as a second user, nobody) and runuser")

PRIVNET = str(support.ROOT / "nbddp" / "forkserver" / "privnet.py")

CELL = """%%ddp -n 2 --output text --push secret
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("READY", os.environ["MASTER_PORT"], os.getpid(), flush=True)
time.sleep(4)
t = torch.ones(1) * secret; dist.all_reduce(t); print("SUM", t.item())
"""

CONNECT = """
import socket, sys
for address in sys.argv[1:]:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        print(address, "connected")
    except OSError as exc:
        print(address, type(exc).__name__)
"""


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", *command], capture_output=True, text=True,
                          timeout=60)


def nobody_connects(addresses) -> dict:
    done = as_nobody("/usr/bin/python3", "-c", CONNECT, *addresses)
    return dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())


def listening_ports(pid: int) -> set[int]:
    """TCP ports listened on in ``pid``'s own network namespace (its /proc/PID/net view)."""
    ports = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{name}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def machine_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def run_and_probe(k: Kernel):
    """Run CELL; while its ranks sleep after init, try the store and each rank's listeners as
    nobody, and read the launch's logs and pushed file as nobody."""
    seen = {}

    def probe(reply):
        match = re.search(r"READY (\d+) (\d+)", reply.stdout)
        if match is None or seen:
            return
        port, pid = int(match.group(1)), int(match.group(2))
        targets = [f"127.0.0.1:{port}"] + [f"{host}:{p}" for p in listening_ports(pid) - {port}
                                           for host in ("127.0.0.1", machine_address())]
        seen["port"], seen["targets"] = port, nobody_connects(targets)
        # ports someone listens on out here (another test's kernel, on another xdist worker): the
        # same number as a rank's in its own namespace, but not the rank
        seen["outside"] = listening_ports(os.getpid())
        seen["net"] = os.readlink(f"/proc/{pid}/ns/net")
        # this launch's (the header names it), not the newest of the machine's: another test's
        # can be newer, and gone by the time it is read
        log_dir = re.search(r"logs in (\S+)", reply.stdout).group(1).rstrip(",)")
        seen["logs"] = as_nobody("cat", os.path.join(log_dir, "rank0.stdout"))
        pushed = glob.glob(f"/dev/shm/nbddp-push-{k.pid}-*")  # this kernel's
        seen["pushed"] = [as_nobody("ls", folder) for folder in pushed]
        seen["planted"] = [as_nobody("touch", os.path.join(folder, "planted")) for folder in pushed]

    k.ok("secret = 21")
    msg_id = k.kc.execute(CELL)
    reply = k.collect(msg_id, timeout=120, on_output=probe)
    assert reply.error is None and reply.status == "ok", reply.text
    assert "SUM 42.0" in reply.stdout
    return seen


def test_by_default_another_user_reaches_the_store_but_not_logs_or_pushed_values(kernel):
    seen = run_and_probe(kernel)
    assert seen["targets"][f"127.0.0.1:{seen['port']}"] == "connected"  # the exposure the docs state
    assert seen["logs"].returncode != 0 and "Permission denied" in seen["logs"].stderr
    assert seen["pushed"] and all(r.returncode != 0 for r in seen["pushed"] + seen["planted"])


@pytest.fixture(scope="module")
def private_kernel(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")), env={**os.environ, "NBDDP_PRIVATE_NET": "1"})
    loaded = k.ok("%load_ext nbddp")
    assert "no private network" not in loaded.text  # this machine allows one
    k.ok("%%ddp -n 1\npass", timeout=300)
    yield k
    k.shutdown()


def test_a_private_network_keeps_store_and_listeners_from_everyone_else(private_kernel):
    started = time.monotonic()
    seen = run_and_probe(private_kernel)
    assert seen["net"] != os.readlink(f"/proc/{private_kernel.pid}/ns/net")
    assert len(seen["targets"]) >= 3, seen  # the store, and at least one gloo listener per address
    inside = {a: v for a, v in seen["targets"].items() if int(a.rsplit(":", 1)[1]) not in seen["outside"]}
    assert len(inside) >= 2 and all(v == "ConnectionRefusedError" for v in inside.values()), \
        (seen["targets"], seen["outside"])
    # not a matter of the uid: from outside the kernel's private network nobody gets in
    for address in inside:
        host, port = address.rsplit(":", 1)
        if int(port) in listening_ports(os.getpid()):
            continue   # someone out here took the number since
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2).close()
    assert seen["logs"].returncode != 0 and seen["pushed"] and all(r.returncode != 0 for r in seen["pushed"])
    assert time.monotonic() - started < 60


def test_a_private_network_still_runs_pools_and_refuses_what_cannot_work(private_kernel):
    k = private_kernel
    k.ok("%ddp_pool start -n 2")
    try:
        reply = k.ok("%%ddp --output text\nimport torch, torch.distributed as dist\n"
                     "dist.init_process_group('gloo'); t = torch.ones(1); dist.all_reduce(t); print('POOL', t.item())")
        assert reply.stdout.count("POOL 2.0") == 2
    finally:
        k.ok("%ddp_pool stop")
    spawn = k.execute("%%ddp -n 2 --start-method spawn\npass")
    assert "--start-method spawn starts ranks outside the private network" in spawn.text
    remote = k.execute("%%ddp -n 2 --master-addr 192.0.2.7\npass")
    assert "is not this machine's loopback" in remote.text


def test_an_unprivileged_user_gets_a_private_network_with_its_own_uid():
    """The path a hub's users take (not root): a user namespace mapping only their own uid."""
    code = ("import importlib.util, os, socket\n"
            f"spec = importlib.util.spec_from_file_location('privnet', {os.path.abspath(PRIVNET)!r})\n"
            "privnet = importlib.util.module_from_spec(spec); spec.loader.exec_module(privnet)\n"
            "outside = privnet.network_id(); privnet.enter()\n"
            "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n"
            "socket.create_connection(l.getsockname()).close()\n"
            "print('UID', os.getuid(), 'NEW', privnet.network_id() != outside)\n")
    done = as_nobody("/usr/bin/python3", "-I", "-c", code)
    if "not allowed here" in done.stderr:
        pytest.skip("this machine allows no unprivileged user namespaces")
    assert done.returncode == 0, done.stderr
    assert "UID 65534 NEW True" in done.stdout


def test_nothing_of_a_private_kernel_outlives_it(private_kernel):
    """The store host ends with the kernel like every other helper (its pipe closes)."""
    import psutil

    k = private_kernel
    k.ok("%%ddp -n 2\npass")
    k.settle()
    helpers = psutil.Process(k.pid).children(recursive=True)
    assert "nbddp-stores" in [p.name() for p in helpers]
    os.kill(k.pid, 9)
    assert not wait_gone([p.pid for p in helpers], 10), [p.name() for p in helpers if alive([p.pid])]


HUB_CELL = """%%ddp -n 2 --output text
import os
print("NET", os.readlink("/proc/self/ns/net"))
"""

OFFLINE_CELL = """%%ddp -n 1 --output text
import urllib.request
urllib.request.urlopen("http://192.0.2.1/data.csv", timeout=5)
"""


def hub_kernel(tmp_path, **env) -> Kernel:
    base = {k: v for k, v in os.environ.items() if k != "NBDDP_PRIVATE_NET"}
    return Kernel(cwd=str(tmp_path), env={**base, "JUPYTERHUB_USER": "student7", **env})


def test_on_a_jupyterhub_server_ranks_get_a_private_network_by_default(tmp_path):
    """A class on one hub: with nothing set, each kernel's ranks are out of reach of the others,
    %load_ext says so and what it costs, and a rank's failed download says why in one line."""
    k = hub_kernel(tmp_path)
    try:
        loaded = k.ok("%load_ext nbddp")
        assert "on this JupyterHub server each launch's ranks run in a private network" in loaded.stdout
        assert "NBDDP_PRIVATE_NET=0 before %load_ext" in loaded.stdout
        reply = k.ok(HUB_CELL, timeout=300)
        nets = set(re.findall(r"NET (net:\[\d+\])", reply.stdout))
        assert len(nets) == 1 and nets != {os.readlink(f"/proc/{k.pid}/ns/net")}, reply.stdout
        assert k.ok("import os; print(os.environ['NBDDP_PRIVATE_NET'])").stdout.strip() == "1"
        offline = k.execute(OFFLINE_CELL, timeout=120)
        assert offline.error is not None
        said = "\n".join(offline.error["traceback"])
        assert "Network is unreachable" in said and "run in a private network" in said, said
        assert "NBDDP_PRIVATE_NET=0" in said
    finally:
        k.shutdown()


def test_on_a_jupyterhub_server_private_net_0_keeps_the_machine_network(tmp_path):
    k = hub_kernel(tmp_path, NBDDP_PRIVATE_NET="0")
    try:
        loaded = k.ok("%load_ext nbddp")
        assert "private network" not in loaded.stdout
        reply = k.ok(HUB_CELL, timeout=300)
        assert set(re.findall(r"NET (net:\[\d+\])", reply.stdout)) == {os.readlink(f"/proc/{k.pid}/ns/net")}
    finally:
        k.shutdown()


SITE_THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"

REFUSED_RUN = """
import nbddp
from nbddp.forkserver import privnet
print("PROBE", privnet.unavailable() or "available", flush=True)
try:
    nbddp.run("import os; print('NET', os.readlink('/proc/self/ns/net'))", n=1)
    print("RAN", flush=True)
except nbddp.DDPUsageError as exc:
    print("REFUSED", exc, flush=True)
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (to drop CAP_SYS_ADMIN)")
def test_a_private_network_that_cannot_be_entered_refuses_the_launch(tmp_path):
    """Private fails closed. As a hub's user runs (root here drops CAP_SYS_ADMIN, so it needs a
    user namespace), with a ``sitecustomize`` that starts a thread at startup: a user namespace
    needs a single-threaded process, so the forkserver cannot enter one. The probe says so (it
    ran ``python -I -S`` and said yes), and ``NBDDP_PRIVATE_NET=1`` refuses the launch in one line
    saying why, before any rank starts (the rank ran on the machine's network)."""
    site, tmp = tmp_path / "site", tmp_path / "tmp"
    site.mkdir()
    tmp.mkdir()
    (site / "sitecustomize.py").write_text(SITE_THREAD)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "NBDDP_PRIVATE_NET": "1", "PYTHONPATH": path, "TMPDIR": str(tmp)}
    done = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--",
                           sys.executable, "-c", REFUSED_RUN], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert "PROBE this Python process had" in done.stdout, done.stdout + done.stderr
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused, done.stdout + done.stderr
    assert "private network (NBDDP_PRIVATE_NET=1), but the forkserver could not enter one" in refused[0]
    assert "a user namespace needs a single-threaded process" in refused[0]
    assert "RAN" not in done.stdout and "NET net:" not in done.stdout, done.stdout
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert wait_until(lambda: not os.listdir(tmp), 10), os.listdir(tmp)
