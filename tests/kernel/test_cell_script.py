"""A cell is the notebook's script: ``__file__`` beside the notebook (hydra's config_path=".",
``Path(__file__).parent``), nothing left behind, tracebacks and stacks naming the cell as IPython
does, the last stderr line of a rank that exits by itself, and one-line hints for unchanged GPU
code on this CPU build of torch. Real kernel, real ranks, real hydra."""
import html
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from support.helpers import wait_until
from support.kernel import plain


def report(reply):
    assert reply.error, f"the cell raised nothing: {reply.text[-2000:]}"
    return plain("\n".join(reply.error["traceback"]))


def cwd_of(kernel):
    return kernel.ok("import os; print(os.getcwd())").stdout.strip()


def left_behind(folder):
    return [name for name in os.listdir(folder) if name.startswith(".nbddp-")]


def prompt_number(kernel):
    """The In[N] of the next cell: what IPython names it in its own tracebacks."""
    return int(kernel.ok("print(get_ipython().execution_count)").stdout) + 1


def test_file_and_argv0_are_beside_the_notebook(kernel):
    folder = cwd_of(kernel)
    with open(os.path.join(folder, "data.txt"), "w") as f:
        f.write("beside the notebook\n")
    os.makedirs(os.path.join(folder, "datapkg"), exist_ok=True)  # a package beside the notebook, with data
    for name, text in (("__init__.py", ""), ("vocab.txt", "a b c\n")):
        with open(os.path.join(folder, "datapkg", name), "w") as f:
            f.write(text)
    reply = kernel.ok("""%%ddp -n 2
import importlib.resources, inspect, json, os, sys
from pathlib import Path
def where(): pass
print("FACTS", json.dumps({
    "dir": os.path.dirname(__file__), "argv0": sys.argv[0] == __file__, "exists": os.path.exists(__file__),
    "getfile": os.path.dirname(inspect.getfile(where)), "module": inspect.getfile(sys.modules["__main__"]) == __file__,
    "data": (Path(__file__).parent / "data.txt").read_text().strip(),
    "resource": importlib.resources.files("datapkg").joinpath("vocab.txt").read_text().strip(),
    "hidden": os.path.basename(__file__).startswith(".")}))
""")
    facts = [json.loads(line.split("FACTS ", 1)[1]) for line in reply.stdout.splitlines() if "FACTS " in line]
    assert len(facts) == 2, reply.text
    for fact in facts:
        assert fact == {"dir": folder, "argv0": True, "exists": True, "getfile": folder, "module": True,
                        "data": "beside the notebook", "resource": "a b c", "hidden": True}
    assert left_behind(folder) == []  # removed when the launch ended
    kept = json.loads(kernel.ok("import json; print(json.dumps([_ddp.script, open(_ddp.cell_file).read()]))").stdout)
    assert os.path.dirname(kept[0]) == folder and "read_text" in kept[1]  # the full copy stays in the log folder


def test_script_goes_with_a_killed_kernel(fresh_kernel, tmp_path):
    fresh_kernel.kc.execute("%%ddp -n 1\nimport time\nprint('running', flush=True)\ntime.sleep(60)")
    assert wait_until(lambda: left_behind(tmp_path), 30), "the launch wrote no script beside the notebook"
    os.kill(fresh_kernel.pid, signal.SIGKILL)  # no atexit, no finally: only the janitor is left
    assert wait_until(lambda: left_behind(tmp_path) == [], 10), left_behind(tmp_path)


def test_hydra_app_with_config_path_dot(kernel):
    folder = cwd_of(kernel)
    with open(os.path.join(folder, "train_cfg.yaml"), "w") as f:
        f.write("lr: 0.5\nepochs: 3\n")
    reply = kernel.ok("""%%ddp -n 2 -- lr=0.25 hydra.run.dir=hydra_out
import os
import hydra

@hydra.main(version_base=None, config_path=".", config_name="train_cfg")
def main(cfg):
    print("rank", os.environ["RANK"], "lr", cfg.lr, "epochs", cfg.epochs)

if __name__ == "__main__":
    main()
""")
    assert "rank 0 lr 0.25 epochs 3" in reply.stdout and "rank 1 lr 0.25 epochs 3" in reply.stdout, reply.text
    assert left_behind(folder) == []


def test_a_rank_exiting_with_code_1_says_its_last_error_line(kernel):
    reply = kernel.execute("""%%ddp -n 2
import hydra

@hydra.main(version_base=None, config_path=".", config_name="gpt2_train_cfg")
def main(cfg):
    pass

main()
""", timeout=60)
    text = report(reply)
    assert "ranks 0,1: failed (exited with code 1: Cannot find primary config 'gpt2_train_cfg'" in text \
        or "rank 0: failed (exited with code 1: Cannot find primary config 'gpt2_train_cfg'" in text, text
    assert "HYDRA_FULL_ERROR" not in text.split("hint")[0]
    assert left_behind(cwd_of(kernel)) == []


def test_argparse_error_is_the_cause(kernel):
    reply = kernel.execute("""%%ddp -n 1
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
args = parser.parse_args()
""", timeout=60)
    text = report(reply)
    assert "failed (exited with code 2: " in text and "error: the following arguments are required: --lr)" in text, text


def test_traceback_names_the_cell_in_pane_error_and_result(kernel):
    n = prompt_number(kernel)
    reply = kernel.execute("""%%ddp -n 2 --ranks 0
import os
if os.environ["RANK"] == "1":
    raise ValueError("bad batch")
raise KeyError("rank zero")
""", timeout=60)
    text = report(reply)
    shown = reply.plain  # rank 0's traceback, streamed as it printed it: IPython's, as in a plain cell
    assert f"Cell In[{n}], line 5\n" in shown and '----> 5 raise KeyError("rank zero")' in shown, shown
    assert "\x1b[" in reply.text, reply.text  # in the kernel's colours
    # rank 1's output was not shown (--ranks 0), so the DDPError carries its traceback, as it printed it
    assert f"Cell In[{n}], line 4\n" in text and '----> 4     raise ValueError("bad batch")' in text, text
    assert ".nbddp-" not in shown + text
    tb = json.loads(kernel.ok("import json; print(json.dumps(_ddp.ranks[1].exception['traceback']))").stdout)
    assert f"Cell In[{n}], line 4, in <module>" in tb  # the result keeps Python's plain text


def test_a_ranks_traceback_follows_the_kernels_colors_and_a_script_gets_pythons(kernel, tmp_path):
    """``%colors nocolor``: IPython's layout without colours; ``nbddp.run`` in a plain script (no
    IPython): Python's own traceback, as the script would print under torchrun."""
    kernel.ok("%colors nocolor")
    try:
        n = prompt_number(kernel)
        reply = kernel.execute("%%ddp -n 1\nx = 1\nraise ValueError('plain')", timeout=60)
    finally:
        kernel.ok("%colors neutral")
    assert f"[rank0]:Cell In[{n}], line 3\n" in reply.text and "[rank0]:----> 3 raise ValueError('plain')" in reply.text
    assert "\x1b[" not in reply.stderr.split("DDPError")[0], reply.stderr
    script = tmp_path / "job.py"
    script.write_text("import nbddp\nnbddp.run('x = 1\\nraise ValueError(x)', 1, check=False)\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "[rank0]:Traceback (most recent call last):" in out.stderr and "[rank0]:ValueError: 1" in out.stderr, out
    assert "\x1b[" not in out.stderr and "---->" not in out.stderr, out.stderr


def test_transcript_names_the_cell(kernel):
    n = prompt_number(kernel)
    reply = kernel.execute("""%%ddp -n 1 --output widgets
def step():
    raise RuntimeError("inside a function")
step()
""", timeout=60)
    report(reply)
    final = [o for o in reply.outputs if "text/html" in o.get("data", {})][-1]["data"]
    for mime in ("text/plain", "text/html"):
        text = html.unescape(re.sub(r"<[^>]+>", "", final[mime]))  # the html's colours are spans
        assert f"Cell In[{n}], line 3, in step()" in text, text[-3000:]
        assert f"Cell In[{n}], line 4\n" in text and "----> 4 step()" in text, text[-3000:]
    assert "\x1b[" not in final["text/plain"] and "<span style" in final["text/html"]


def test_timeout_stacks_name_the_cell(kernel):
    n = prompt_number(kernel)
    reply = kernel.execute("""%%ddp -n 2 --timeout 3
import time
def wait_forever():
    time.sleep(60)
wait_forever()
""", timeout=60)
    assert reply.error and reply.error["ename"] == "DDPTimeout", reply.text
    stacks = json.loads(kernel.ok("import json; print(json.dumps([r.stack for r in _ddp.ranks]))").stdout)
    for stack in stacks:
        assert f"Cell In[{n}], line 4 in wait_forever\n      time.sleep(60)" in stack, stack
        assert f"Cell In[{n}], line 5 in <module>\n      wait_forever()" in stack, stack
        assert ".nbddp-" not in stack


def test_pool_cells_are_scripts_beside_the_notebook_too(kernel):
    folder = cwd_of(kernel)
    kernel.ok("%ddp_pool start -n 2")
    try:
        facts = kernel.ok("%%ddp\nimport os, sys\nprint('POOL', os.path.dirname(__file__) == os.getcwd(), "
                          "sys.argv[0] == __file__, os.path.exists(__file__))")
        assert facts.stdout.count("POOL True True True") == 2, facts.text
        n = prompt_number(kernel)
        reply = kernel.execute("%%ddp\nx = 1\nraise ValueError('in the pool')", timeout=60)
        assert f"Cell In[{n}], line 3\n" in reply.plain and "----> 3 raise ValueError('in the pool')" in reply.plain, \
            reply.plain
    finally:
        kernel.ok("%ddp_pool stop")
    assert left_behind(folder) == []
    out = kernel.ok("print(open(_ddp.cell_file).read())").stdout
    assert "in the pool" in out


def test_torchrun_launcher_runs_the_script_beside_the_notebook(kernel):
    folder = cwd_of(kernel)
    n = prompt_number(kernel)
    reply = kernel.execute("""%%ddp --launcher torchrun -n 2
import os, sys, torch.distributed as dist
print("TR", os.path.dirname(__file__) == os.getcwd(), sys.argv[0] == __file__, os.path.exists(__file__), flush=True)
dist.init_process_group("gloo"); dist.barrier()  # rank 0 has printed before rank 1 fails it
if os.environ["RANK"] == "1":
    raise ValueError("under torchrun")
""", timeout=120)
    report(reply)
    assert reply.text.count("TR True True True") == 2, reply.text
    assert f"Cell In[{n}], line 6\n" in reply.plain, reply.plain  # IPython's, under torchrun too
    assert left_behind(folder) == []


SWAPPED = """%%ddp --launcher torchrun -n 1 --max-restarts 1
import os
print("RUN", os.environ["TORCHELASTIC_RESTART_COUNT"], os.path.dirname(__file__) == os.getcwd(), flush=True)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    planted = __file__ + ".planted"
    with open(planted, "w") as f:
        f.write("print('SOMEONE ELSE', flush=True)\\n")
    os.replace(planted, __file__)   # as another user could in a group-writable folder
    raise SystemExit(1)             # torchrun restarts the rank: by the script's path
"""


def test_a_torchrun_restart_runs_what_nbddp_wrote_not_what_the_path_names_now(kernel):
    """Issue #37 point 4: a file renamed over the script beside the notebook between two
    torchrun starts is not run; the restart runs the cell nbddp wrote (its copy in the 0700 log
    folder), with __file__ still beside the notebook."""
    folder = cwd_of(kernel)
    reply = kernel.execute(SWAPPED, timeout=120)
    assert "SOMEONE ELSE" not in reply.text, reply.text
    assert reply.status == "ok" and "RUN 1 True" in reply.text, reply.text
    assert left_behind(folder) == []


# Unchanged GPU code from the tutorials, on this CPU build: each gets its one-line hint.
GPU_SNIPPETS = {
    "set_device": ("import os, torch\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
                   "this torch is a CPU build, so torch.cuda.set_device(...) cannot run"),
    "to_local_rank": ("import os, torch\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
                      "model = torch.nn.Linear(4, 2).to(local_rank)",
                      "torch.device('cpu')` and .to(device)"),
    "cuda": ("import torch\nmodel = torch.nn.Linear(4, 2).cuda()", "this torch is a CPU build, so .cuda()"),
    "device_ids": ("import os, torch, torch.distributed as dist\n"
                   "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                   "dist.init_process_group('gloo')\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
                   "ddp_model = DDP(torch.nn.Linear(4, 2), device_ids=[local_rank])",
                   "on CPU give none, DDP(model)"),
    "device_id": ("import os, torch, torch.distributed as dist\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
                  "dist.init_process_group('gloo', device_id=torch.device('cuda', local_rank))",
                  "drop device_id=..."),
    "nccl": ("import torch.distributed as dist\ndist.init_process_group('nccl')",
             "nccl needs CUDA GPUs, and this torch is a CPU build"),
}


@pytest.mark.parametrize("name", sorted(GPU_SNIPPETS))
def test_gpu_code_on_cpu_gets_its_hint(kernel, name):
    code, phrase = GPU_SNIPPETS[name]
    text = report(kernel.execute(f"%%ddp -n 2\n{code}\n", timeout=60))
    # each hint with its wrapped continuation lines (indented deeper), as one line
    hints = [" ".join(h.split()) for h in re.findall(r"hint \(rank.*(?:\n {4,}\S.*)*", text)]
    assert hints and all(phrase in hint for hint in hints), text
