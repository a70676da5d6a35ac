"""%ddp_diff and --diff on real ranks: equal ranks, ranks diverged on purpose (a parameter, a
buffer, optimizer state, a generator) named exactly with their ranks and max abs difference, bad
names as one line, --diff at a fresh cell's end, and DDP's own error pointing at it."""
import re

SETUP = """%%ddp
import os, random
import numpy as np, torch
rank = int(os.environ["RANK"])
torch.manual_seed(0); random.seed(0); np.random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.randn(5, 4)).sum().backward()
opt.step()
"""
# Linear: weight, bias; BatchNorm: weight, bias, running_mean, running_var, num_batches_tracked;
# Adam: step, exp_avg, exp_avg_sq for each of the 4 parameters
TENSORS = 7 + 4 * 3


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_equal_then_diverged_ranks_on_a_pool(kernel):
    k = kernel
    k.ok("%ddp_pool start -n 2 --output text")
    try:
        k.ok(SETUP)
        reply = k.ok("%ddp_diff model opt rng")
        assert re.fullmatch(rf"%ddp_diff: all 2 ranks equal \({TENSORS} tensors, \d+ other values, "
                            r"3 generator states\)\n", reply.stdout), reply.text
        k.ok("%%ddp\nif rank == 1:\n"
             "    with torch.no_grad():\n        model[0].weight[0, 0] += 0.5\n"
             "    model[1].running_mean += 1\n"
             "    opt.state[model[0].bias]['exp_avg'][1] -= 0.25\n"
             "    torch.manual_seed(1)\n")
        reply = k.ok("%ddp_diff model opt rng")
        lines = _lines(reply.stdout)
        assert re.fullmatch(r"%ddp_diff: 4 of \d+ entries differ across the 2 ranks \(each against rank 0\):",
                            reply.stdout.splitlines()[0]), reply.stdout
        assert lines[1:] == [
            ["model.0.weight", "rank", "1", "max", "abs", "diff", "0.5"],
            ["model.1.running_mean", "rank", "1", "max", "abs", "diff", "1"],
            ["opt.state[model.0.bias].exp_avg", "rank", "1", "max", "abs", "diff", "0.25"],
            ["rng.torch", "rank", "1", "generator", "state", "differs", "(seeded", "or", "drawn", "differently)"],
        ], reply.stdout
        # one module alone, by its attribute path; the pool's cells go on as before
        assert _lines(k.ok("%ddp_diff model.1").stdout)[1:] == [
            ["model.1.running_mean", "rank", "1", "max", "abs", "diff", "1"]]
        # --diff on a pool cell, and the same from Python
        reply = k.ok("%%ddp --diff model.0\npass")
        assert reply.stdout.rstrip().endswith(
            "--diff model.0: 1 of 2 tensors differ across the 2 ranks (each against rank 0):\n"
            "  model.0.weight  rank 1  max abs diff 0.5"), reply.text
        reply = k.ok("print(type(get_ipython().find_magic('ddp_pool').__self__).pool.diff('model.0'))")
        assert reply.stdout.startswith("%ddp_diff: 1 of 2 tensors differ"), reply.text
        # bad names: one line each, before or after asking the ranks
        k.ok("%%ddp\nif rank == 1:\n    only_here = torch.zeros(2)\ngen = (i for i in [])")
        for line, says in (("%ddp_diff", "UsageError: %ddp_diff: usage: %ddp_diff NAME"),
                           ("%ddp_diff 1x", "UsageError: %ddp_diff: not a Python name: '1x'"),
                           ("%ddp_diff model nope", "UsageError: %ddp_diff: no name 'nope'\n"),
                           ("%ddp_diff only_here", "UsageError: %ddp_diff: no name 'only_here' (on rank 0)\n"),
                           ("%ddp_diff gen", "UsageError: %ddp_diff: 'gen' is a generator: %ddp_diff compares")):
            reply = k.execute(line)
            assert reply.status == "error" and reply.stderr.startswith(says), (line, reply.text)
            assert "Traceback" not in reply.text
        k.ok("%%ddp\nassert model[0].weight.shape == (3, 4)")  # the pool serves on
    finally:
        k.execute("%ddp_pool stop")
    reply = k.execute("%ddp_diff model")
    assert reply.status == "error" and reply.stderr.startswith(
        "UsageError: %ddp_diff compares a running pool's ranks, and none is running"), reply.text


def test_diff_at_a_fresh_cells_end(kernel):
    reply = kernel.ok("%%ddp -n 2 --diff model,rng --timeout 60 --output text\n"
                      "import os, torch\nrank = int(os.environ['RANK'])\n"
                      "torch.manual_seed(rank)  # the mistake: each rank seeds differently\n"
                      "model = torch.nn.Linear(3, 2)\nprint('built')\n")
    out = reply.stdout
    assert out.index("--diff model,rng: ") > out.rindex("built"), out  # after the ranks' output
    report = out[out.index("--diff model,rng: "):]
    # torch and numpy ask for the count: numpy's generator (seeded in the forkserver) is the same on both;
    # Python's reseeds in every forked process (random's own at-fork hook), so unseeded it differs too
    assert report.splitlines()[0] == ("--diff model,rng: 4 of 5 entries differ across the 2 ranks "
                                      "(each against rank 0):"), report
    assert [line.split()[:3] for line in report.splitlines()[1:]] == [
        ["model.weight", "rank", "1"], ["model.bias", "rank", "1"], ["rng.torch", "rank", "1"],
        ["rng.python", "rank", "1"]], report
    assert "max abs diff" in report.splitlines()[1]
    assert kernel.ok("print(_ddp.diff == " + repr(report.rstrip("\n")) + ")").stdout == "True\n"
    # a cell that fails never reaches the comparison; its traceback shows the cell's lines only
    reply = kernel.execute("%%ddp -n 2 --diff model --timeout 60 --output text\n"
                           "import torch\nmodel = torch.nn.Linear(3, 2)\nraise ValueError('boom')\n")
    assert reply.status == "error"
    assert "--diff model: not compared: the cell failed on ranks 0–1 before its end" in reply.stdout, reply.text
    assert "diffing" not in reply.text and "exchange" not in reply.text, reply.text
    # seeded alike: equal
    reply = kernel.ok("%%ddp -n 2 --diff model --timeout 60 --output text\n"
                      "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 2)\n")
    assert "--diff model: all 2 ranks equal (2 tensors)" in reply.stdout, reply.text


def test_ddp_same_model_error_points_at_diff(kernel):
    reply = kernel.execute("%%ddp -n 2 --timeout 60 --output text\n"
                           "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                           "model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(1 + dist.get_rank())])\n"
                           "ddp = torch.nn.parallel.DistributedDataParallel(model)\n")
    assert reply.status == "error"
    assert "DDP expects same model across all ranks" in reply.text, reply.text
    shown = " ".join((reply.text + reply.error["evalue"] + "\n".join(reply.error["traceback"])).split())
    assert "%ddp_diff model on a pool, or --diff model on a cell that builds it without DDP" in shown, shown
    hints = kernel.ok("print([r.hint for r in _ddp.ranks])").stdout
    assert hints.count("names which tensor differs on which rank") == 2, hints
