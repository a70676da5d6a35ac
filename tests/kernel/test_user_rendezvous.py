"""The rendezvous patterns of PyTorch's own tutorials, in real %%ddp cells (nbddp/rank/user_rendezvous.py):
a cell's own MASTER_ADDR/MASTER_PORT with rank=/world_size=, init_method="tcp://…" and
"file://…", and mp.spawn inside a rank all run; a rendezvous that cannot work here fails at
once, naming the cell line that set it. Each pattern was written for this project."""
import socket

import pytest

from nbddp.rank import user_rendezvous
from support.helpers import free_port, wait_gone
from support.kernel import worker_pids


def sums(reply, tag="sum"):
    """The ``tag …`` lines the ranks (or their children) printed, without the [rankN]: prefix."""
    return sorted(line.split("]:", 1)[1] for line in reply.stdout.splitlines() if f"]:{tag} " in line)


ALL_REDUCE = """
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", dist.get_rank(), t.item(), os.environ["TORCHELASTIC_USE_AGENT_STORE"])
dist.destroy_process_group()
"""


def test_own_master_addr_and_port_with_rank_and_world_size(kernel):
    port = free_port()
    reply = kernel.ok(f"""%%ddp -n 2
import os, torch, torch.distributed as dist

def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "{port}"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

setup(int(os.environ["RANK"]), 2)
{ALL_REDUCE}""", timeout=90)
    # all_reduce over both ranks; torchrun's variable is back as it was after the rendezvous
    assert sums(reply) == ["sum 0 3.0 True", "sum 1 3.0 True"], reply.text


def test_tcp_init_method(kernel):
    port = free_port()
    reply = kernel.ok(f"""%%ddp -n 2
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}",
                        rank=int(os.environ["RANK"]), world_size=2)
{ALL_REDUCE}""", timeout=90)
    assert sums(reply) == ["sum 0 3.0 True", "sum 1 3.0 True"], reply.text


def test_file_init_method(kernel, tmp_path):
    reply = kernel.ok(f"""%%ddp -n 2
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
{ALL_REDUCE}""", timeout=90)
    assert sums(reply) == ["sum 0 3.0 True", "sum 1 3.0 True"], reply.text


def test_mp_spawn_inside_a_rank(kernel):
    """The whole-script pattern: a __main__ that mp.spawn()s its own 2-process group on its own
    port (fresh interpreters, inheriting the rank's environment), here in a 1-rank cell."""
    port = free_port()
    reply = kernel.ok(f"""%%ddp -n 1
import os, torch, torch.distributed as dist, torch.multiprocessing as mp

def demo(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "{port}"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    # one write per line: two processes share the rank's pipe, and print() writes its pieces
    # one by one where stdout is unbuffered, so their lines could interleave mid-line
    os.write(1, f"child {{rank}} {{t.item()}}\\n".encode())
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(demo, args=(2,), nprocs=2, join=True)
    print("spawned group done")
""", timeout=120)
    assert sums(reply, "child") == ["child 0 3.0", "child 1 3.0"], reply.text
    assert "spawned group done" in reply.stdout
    assert not wait_gone(worker_pids(kernel), 5)


# ------------------------------------------------------- rendezvous that cannot work here
def failing(kernel, cell):
    reply = kernel.execute(cell, timeout=60)
    assert reply.error and reply.error["ename"] == "DDPError", reply.text[-3000:]
    assert reply.elapsed < 30, "a hint case must fail fast, not wait for a timeout"
    return "\n".join(reply.error["traceback"])


def test_port_held_by_another_process(kernel):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        text = failing(kernel, f"""%%ddp -n 2
import os, torch.distributed as dist
os.environ["MASTER_ADDR"] = "127.0.0.1"
os.environ["MASTER_PORT"] = "{port}"
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
""")
    assert (f"rank 0: failed (RendezvousError: port {port} (set at cell line 4: "
            f"os.environ[\"MASTER_PORT\"] = \"{port}\") is held by another process on this machine "
            f"at cell line 5)") in text, text
    assert "rank 0 hosts the rendezvous store on the port the cell chose" in text


@pytest.mark.parametrize("addr, problem", [
    ("10.255.255.1", "is not an address of this machine"),  # never contacted: checked locally
    ("no-such-host.invalid", "does not resolve"),
])
def test_address_not_on_this_machine(kernel, addr, problem):
    text = failing(kernel, f"""%%ddp -n 2
import os, torch.distributed as dist
port = 29511
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{{port}}",
                        rank=int(os.environ["RANK"]), world_size=2)
""")
    assert (f"RendezvousError: MASTER_ADDR '{addr}' (set at cell line 4: "
            f"dist.init_process_group(\"gloo\", init_method=f\"tcp://{addr}:{{port}}\",) {problem}") in text
    assert "every rank of %%ddp runs on this machine" in text


def test_world_size_other_than_the_launch(kernel):
    text = failing(kernel, f"""%%ddp -n 2
import os, torch.distributed as dist
os.environ["MASTER_PORT"] = "{free_port()}"
dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                        world_size=4)
""")
    assert ("RendezvousError: world_size=4 (set at cell line 5: world_size=4)) but this %%ddp "
            "launch has 2 ranks at cell line 4") in text, text
    assert "the group would wait for ranks that never come" in text


def test_which_addresses_are_here():
    assert user_rendezvous._not_here("localhost") is None
    assert user_rendezvous._not_here("127.0.0.1") is None
    assert user_rendezvous._not_here(socket.gethostname()) is None
    assert user_rendezvous._not_here("10.255.255.1") == "is not an address of this machine"


def test_every_rank_passing_rank_0(kernel):
    """A tutorial's setup(0, 2) pasted unchanged: both ranks try to host; the second is told why."""
    text = failing(kernel, f"""%%ddp -n 2
import os, time, torch.distributed as dist
if os.environ["RANK"] == "1":
    time.sleep(1)                                  # rank 0 of the launch binds the port first
os.environ["MASTER_PORT"] = "{free_port()}"
dist.init_process_group("gloo", rank=0, world_size=2)
""")
    assert "is held by another process on this machine (perhaps another rank: this is rank 1 " \
           "of the launch, passing rank=0) at cell line 6)" in text, text
