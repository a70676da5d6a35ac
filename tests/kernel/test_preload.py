"""The forkserver's preload (nbddp/forkserver/preload.py), seen from inside real ranks: a fresh DDP cell
finds DDP's modules already imported, the forkserver never touched CUDA, and the notebook's
own modules are preloaded, except unsafe ones, edited ones, or with NBDDP_PRELOAD=0."""
import json
import os
import textwrap

import pytest

from support.kernel import Kernel

PROBE = "import sys, json, os\nprint('MODS', json.dumps({m: m in sys.modules for m in NAMES}))\n"


def _mods(reply, n):
    found = [json.loads(line.split("MODS ", 1)[1]) for line in reply.stdout.splitlines() if "MODS " in line]
    assert len(found) == n, reply.text
    return found


def test_a_fresh_ddp_cell_starts_with_ddp_loaded_and_runs(kernel):
    names = ["torch._dynamo", "torch.nn.parallel", "torch.optim", "torch.utils.data.distributed",
             "torch.distributed.fsdp", "torch.distributed.checkpoint", "torch.profiler"]
    cell = PROBE.replace("NAMES", repr(names)) + textwrap.dedent("""\
        import torch, torch.distributed as dist
        print('CUDA', torch.cuda._initialized, 'libcuda.so' in open('/proc/self/maps').read())
        import signal; print('SIGUSR2', signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(10, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad(); model(torch.randn(8, 10)).sum().backward(); opt.step()
        dist.destroy_process_group()
        print("stepped")""")
    reply = kernel.ok(f"%%ddp -n 4 --output text\n{cell}")
    for mods in _mods(reply, 4):
        assert all(mods.values()), f"not preloaded: {[m for m, ok in mods.items() if not ok]}"
    assert reply.stdout.count("stepped") == 4, reply.text
    # a forked rank starts with the forkserver's state: CUDA was never initialised there
    assert reply.stdout.count("CUDA False False") == 4, reply.text
    assert reply.stdout.count("SIGUSR2 True") == 4, reply.text  # the forkserver's own handler is not inherited


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime + 2))  # a visible change even within one second


def _offered(kernel):
    kernel.settle()
    return json.loads(kernel.ok("import json, nbddp.forkserver.preload as p; print(json.dumps(p._offered))").stdout)


@pytest.fixture
def user_dir(kernel, tmp_path):
    kernel.ok(f"import sys; sys.path.insert(0, {str(tmp_path)!r})")
    yield tmp_path
    kernel.ok(f"sys.path.remove({str(tmp_path)!r})")


def test_the_notebooks_own_module_is_preloaded_and_an_edit_is_seen(kernel, user_dir):
    _write(user_dir / "nbpre_mine.py", "import os\nVALUE = 1\nIMPORTED_IN = os.getpid()\n")
    _write(user_dir / "nbpre_threads.py",
           "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    kernel.ok("import nbpre_mine, nbpre_threads")
    kernel.ok("%%ddp -n 2\npass")  # after it, the forkserver is offered the two modules
    verdicts = _offered(kernel)
    assert verdicts.get("nbpre_mine") == "ok", verdicts
    assert "started a thread" in verdicts.get("nbpre_threads", ""), verdicts
    cell = PROBE.replace("NAMES", repr(["nbpre_mine", "nbpre_threads"])) + \
        "import nbpre_mine\nprint('VALUE', nbpre_mine.VALUE, nbpre_mine.IMPORTED_IN != os.getpid())\n"
    reply = kernel.ok(f"%%ddp -n 2 --output text\n{cell}")
    assert _mods(reply, 2) == [{"nbpre_mine": True, "nbpre_threads": False}] * 2
    assert reply.stdout.count("VALUE 1 True") == 2, reply.text  # imported once, in the forkserver
    _write(user_dir / "nbpre_mine.py", "import os\nVALUE = 2\nIMPORTED_IN = os.getpid()\n")
    reply = kernel.ok(f"%%ddp -n 2 --output text\n{cell}")
    assert reply.stdout.count("VALUE 2") == 2, reply.text  # the file on disk, as torchrun would


def test_nbddp_preload_0_offers_nothing(tmp_path):
    _write(tmp_path / "nbpre_off.py", "X = 1\n")
    k = Kernel(cwd=str(tmp_path), env={**os.environ, "NBDDP_PRELOAD": "0"})
    try:
        k.ok("%load_ext nbddp")
        k.ok("import nbpre_off")
        k.ok("%%ddp -n 2\npass")
        assert _offered(k) == {}
        reply = k.ok("%%ddp -n 2 --output text\n" + PROBE.replace("NAMES", repr(["nbpre_off", "torch._dynamo"])))
        assert _mods(reply, 2) == [{"nbpre_off": False, "torch._dynamo": True}] * 2  # the base list stays
    finally:
        k.shutdown()


def test_offers_while_ranks_are_forked_never_stall_the_forkserver(tmp_path):
    """A new module imported before each of many short cells: the offer after each cell (in
    the spares' refill) meets the next cell's forks. The forkserver once took offers in a
    SIGUSR2 handler, which could run inside another fork's after-fork hook and fork again
    there (it deadlocked 1-3 times in 150 cells), and stale() iterated a dict the offer thread
    was changing (RuntimeError in 0-5 of 150)."""
    cells = 150
    for i in range(cells):
        (tmp_path / f"offered_{i}.py").write_text(f"VALUE = {i}\n")
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")
        k.ok("%%ddp -n 1\npass", timeout=300)
        failed = []
        for i in range(cells):
            k.ok(f"import offered_{i}")
            reply = k.execute(f"%%ddp -n 2 --timeout 20 --output text\nimport offered_{i}\n"
                              f"print('value', offered_{i}.VALUE)", timeout=60)
            if reply.status != "ok" or reply.stdout.count(f"value {i}") != 2:
                failed.append((i, reply.text[-300:]))
        assert not failed, f"{len(failed)} of {cells} cells failed, e.g. {failed[:2]}"
        offered = _offered(k)
        assert sum(v == "ok" for k_, v in offered.items() if k_.startswith("offered_")) >= cells - 5, offered
    finally:
        k.shutdown()


def test_torch_compile_cache_is_private_not_the_predictable_tmp_folder(kernel):
    """The preload imports torch._dynamo, which made ``/tmp/torchinductor_<user>``: a name any
    user can make first (and then own the user's compiled code). The ranks' (and the
    forkserver's) cache is a 0700 folder of nbddp's, removed with the kernel."""
    reply = kernel.ok("%%ddp -n 1 --output text\n"
                      "import os\n"
                      "from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir\n"
                      "path = cache_dir(); info = os.stat(path)\n"
                      "print('CACHE', path != default_cache_dir(), os.path.basename(path).startswith('nbddp-'),"
                      " oct(info.st_mode & 0o777), info.st_uid == os.getuid())")
    assert "CACHE True True 0o700 True" in reply.stdout, reply.text
    # the kernel's own torch is left as it was
    shown = kernel.ok("import os; print('KERNEL', os.environ.get('TORCHINDUCTOR_CACHE_DIR'))").stdout
    assert shown.strip() == "KERNEL None"
