"""diagnosis on texts, pure: the hint table on error texts torch 2.13 really prints, the last error
line of a rank that exits by itself, stack parsing and the timeout and idle reports. (The same on
real processes: tests/kernel/test_diagnosis.py.)"""
import os

import pytest

from nbddp.core import diagnosis
from nbddp.core.cellnames import name_cell, name_cell_ipython
from nbddp.core.result import OK, RankResult, RunResult

# ----------------------------------------------------------------------------- hints
# Each text below was printed by torch 2.13.0 (CPU build) in this project's environment; the
# tests in tests/kernel/test_diagnosis.py produce the most common ones again for real.
REAL_TEXTS = {
    "env": "Error initializing torch.distributed using env:// rendezvous: environment variable "
           "MASTER_ADDR expected, but not set",
    "env_rank": "Error initializing torch.distributed using env:// rendezvous: environment variable "
                "RANK expected, but not set",
    "in_use": "The server socket has failed to listen on any local network address. port: 36221, "
              "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
    "no_pg": "Default process group has not been initialized, please make sure to call "
             "init_process_group.",
    "mismatch": "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
                "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[3], "
                "TensorDtypes=Float), but Rank 1 is running collective: CollectiveFingerPrint("
                "SequenceNumber=0, OpType=BROADCAST, TensorShape=[2], TensorDtypes=Float).",
    "oom": "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 3.19 GiB is free.",
    "ordinal": "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously "
               "reported at some other API call",
    "duplicate": "NCCL error: invalid usage, NCCL version 2.21.5\nncclInvalidUsage: This usually "
                 "reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : "
                 "rank 1 and rank 0 both on CUDA device 1000",
    # the same without NCCL's last error (torch's NCCLUtils.cpp words; this machine has no NCCL)
    "invalid_usage": "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage "
                     "(run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5\nncclInvalidUsage: This "
                     "usually reflects invalid usage of NCCL library.",
    "no_nccl": "Distributed package doesn't have NCCL built in",
    "no_cuda": "Torch not compiled with CUDA enabled",
    # unchanged GPU code on this CPU build (tests/kernel/test_cell_script.py runs each snippet for real)
    "set_device": "module 'torch._C' has no attribute '_cuda_setDevice'",
    "to_rank": "Cannot access accelerator device when none is available.",
    "device_ids": "DistributedDataParallel device_ids and output_device arguments only work with "
                  "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], "
                  "output_device None, and module parameters {device(type='cpu')}.",
    "device_id": "device_id cuda:0 does not match the current compilation's accelerator support: None. "
                 "Please use a different compiled version that supports your accelerator.",
    "device_id_int": "device_id is an int, but no accelerator support is found from the current "
                     "compilation. Please use a different compiled version that supports your accelerator.",
    # a CUDA build on a machine without a GPU: the message is in this torch's libtorch_cpu.so,
    # but this machine has no CUDA build to print it
    "no_gpu": "RuntimeError: No CUDA GPUs are available",
    "peer_closed": "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                   "Connection closed by peer [127.0.0.1]:16027. This is typically caused by a "
                   "remote worker crashing.",
    "no_stdin": "EOF when reading a line",
    # DDP(model) on ranks whose models differ: the count of parameters, or a parameter's shape
    "ddp_count": "DDP expects same model across all ranks, but Rank 0 has 2 params, while rank 1 has "
                 "inconsistent 4 params.",
    "ddp_shape": "[1]: params[0] in this process with sizes [4, 4] appears not to match sizes of the "
                 "same param in process 0.",  # input() under --launcher torchrun (stdin /dev/null)
    "peer_reset": "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
                  "error [127.0.0.1]:29837: Connection reset by peer. This is typically caused by "
                  "a remote worker hanging or bugs in the application.",
    # nbddp/rank/user_rendezvous.py, as tests/kernel/test_user_rendezvous.py produces them
    "own_port": 'port 41235 (set at cell line 4: os.environ["MASTER_PORT"] = "41235") is held by '
                "another process on this machine",
    "own_addr": "MASTER_ADDR '10.255.255.1' (set at cell line 3: os.environ[\"MASTER_ADDR\"] = "
                "\"10.255.255.1\") is not an address of this machine",
    "own_size": "world_size=4 (set at cell line 5: world_size=4)) but this %%ddp launch has 2 ranks",
}

EXPECTED = {  # a phrase the hint for each text must contain
    "env": "Run this under %%ddp",
    "env_rank": "Run this under %%ddp",
    "in_use": "omit --master-port",
    "no_pg": "dist.init_process_group",
    "mismatch": "different collectives",
    "oom": "ran out of memory",
    "ordinal": "its own GPU",
    "duplicate": "its own GPU",
    "invalid_usage": "NCCL_DEBUG=WARN prints NCCL's reason",
    "no_nccl": "use gloo",
    "no_cuda": "this torch is a CPU build, so .cuda()",
    "set_device": "torch.cuda.set_device(...) cannot run",
    "to_rank": "else torch.device('cpu')",
    "device_ids": "DDP(model)",
    "device_id": "drop device_id=",
    "device_id_int": "drop device_id=",
    "no_gpu": "this machine has no GPU",
    "peer_closed": "another rank ended",
    "peer_reset": "another rank ended",
    "own_port": "rank 0 hosts the rendezvous store",
    "own_addr": "runs on this machine",
    "own_size": "ranks that never come",
    "no_stdin": "--push NAME",
    "ddp_count": "%ddp_diff model",
    "ddp_shape": "--diff model",
}


@pytest.mark.parametrize("key", sorted(REAL_TEXTS))
def test_each_hint_matches_its_real_text(key):
    hint = diagnosis.hint_for(REAL_TEXTS[key])
    assert hint is not None, f"no hint for {key}"
    assert EXPECTED[key] in hint, hint


def test_every_hint_in_the_table_is_reached():
    texts = list(REAL_TEXTS.values()) + [GLOO_SIZE_MISMATCH]
    reached = {diagnosis.hint_for(text) for text in texts}
    unreached = [pattern.pattern for pattern, hint in diagnosis.HINTS
                 if hint not in reached and "timed out" not in pattern.pattern]
    assert not unreached, unreached


# gloo's enforce for an all_reduce whose sizes differ (seen in torch issues; on this machine the
# same mistake ended with "Connection closed by peer", which its own hint covers)
GLOO_SIZE_MISMATCH = "[enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 12 vs 8"


def test_mismatch_hint_without_detail_suggests_detail():
    hint = diagnosis.hint_for(GLOO_SIZE_MISMATCH)
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in hint


@pytest.mark.parametrize("text", ["", "ValueError: bad batch on rank one",
                                  "ZeroDivisionError: division by zero"])
def test_ordinary_errors_get_no_hint(text):
    assert diagnosis.hint_for(text) is None


# what ranks that exit by themselves wrote last (hydra 1.3.8, argparse, click, as printed here)
HYDRA_MISSING = """Cannot find primary config 'gpt2_train_cfg'. Check that it's in your config search path.

Config search path:
\tprovider=hydra, path=pkg://hydra.conf
\tprovider=main, path=file:///home/me/nb
\tprovider=schema, path=structured://

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""
HYDRA_TASK_ERROR = """Error executing job with overrides: []
Traceback (most recent call last):
  File "/home/me/nb/.nbddp-77.py", line 6, in main
    raise ValueError("lr must be positive")
ValueError: lr must be positive

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""
ARGPARSE = """usage: .nbddp-77.py [-h] --lr LR
.nbddp-77.py: error: the following arguments are required: --lr
"""
CLICK = """Usage: train.py [OPTIONS]
Try 'train.py --help' for help.

Error: Missing option '--lr'.
"""
WARNED = """/home/me/nb/.nbddp-77.py:3: UserWarning: something
  warnings.warn("something")
"""


@pytest.mark.parametrize("stderr, said", [
    (HYDRA_MISSING, "Cannot find primary config 'gpt2_train_cfg'. Check that it's in your config search path."),
    (HYDRA_TASK_ERROR, "ValueError: lr must be positive"),
    (ARGPARSE, ".nbddp-77.py: error: the following arguments are required: --lr"),
    (CLICK, "Error: Missing option '--lr'."),
    ("fatal: \x1b[31mno data\x1b[0m\n", "fatal: no data"),
    (WARNED, None),
    ("", None),
])
def test_last_error_line(stderr, said):
    assert diagnosis.last_error_line(stderr) == said


def test_exit_code_cause_gets_the_last_error_line_only_without_a_traceback(tmp_path):
    err = tmp_path / "rank0.stderr"
    err.write_text(HYDRA_MISSING)
    quiet = RankResult(rank=0, local_rank=0, node_rank=0, state="failed", cause="exited with code 1",
                       stderr_path=str(err))
    raised = RankResult(rank=1, local_rank=1, node_rank=0, state="failed", cause="ValueError: x at cell line 2",
                        exception={"type": "ValueError", "message": "x"}, stderr_path=str(err))
    diagnosis.add_hints(RunResult(ranks=[quiet, raised], world_size=2, log_dir=str(tmp_path)))
    assert quiet.cause == ("exited with code 1: Cannot find primary config 'gpt2_train_cfg'. "
                           "Check that it's in your config search path.")
    assert raised.cause == "ValueError: x at cell line 2"


def test_add_hints_only_for_ranks_that_did_not_finish_ok(tmp_path):
    err = tmp_path / "rank0.stderr"
    err.write_text("Traceback...\nRuntimeError: " + REAL_TEXTS["peer_closed"] + "\n")
    ok_err = tmp_path / "rank1.stderr"
    ok_err.write_text("some warning: Connection closed by peer\n")
    failed = RankResult(rank=0, local_rank=0, node_rank=0, state="failed", stderr_path=str(err))
    fine = RankResult(rank=1, local_rank=1, node_rank=0, state=OK, stderr_path=str(ok_err))
    nopg = RankResult(rank=2, local_rank=2, node_rank=0, state="failed",
                      exception={"type": "ValueError", "message": REAL_TEXTS["no_pg"]})
    result = RunResult(ranks=[failed, fine, nopg], world_size=3, log_dir=str(tmp_path))
    diagnosis.add_hints(result)
    assert "another rank ended" in failed.hint
    assert fine.hint is None
    assert "init_process_group" in nopg.hint


def test_blocked_at_without_cell_frames_names_the_innermost_function():
    text = ('Thread 0x00007f (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
            '  File "/home/u/lib.py", line 12 in work\n')
    assert diagnosis.blocked_at(text, "/tmp/cell.py", "x = 1\n") == "wait (threading.py:327)"
    assert diagnosis.blocked_at("", "/tmp/cell.py", None) is None


def test_stack_complete_needs_a_header_and_a_final_newline():
    assert not diagnosis.stack_complete("")
    assert not diagnosis.stack_complete('Thread 0x1 (most recent call first):\n  File "a", line 1')
    assert diagnosis.stack_complete('Thread 0x1 (most recent call first):\n  File "a", line 1 in f\n')


def test_long_first_lines_are_shortened_in_the_cause():
    message = "Detected mismatch between collectives on ranks. " + "CollectiveFingerPrint(...) " * 40
    cause = diagnosis.describe_failure({"type": "RuntimeError", "message": message, "cell_line": 7}, 1)
    assert cause.startswith("RuntimeError: Detected mismatch between collectives on ranks.")
    assert cause.endswith("… at cell line 7") and len(cause) < 300
    short = diagnosis.describe_failure({"type": "ValueError", "message": "bad", "cell_line": 2}, 1)
    assert short == "ValueError: bad at cell line 2"


def _blocked(rank, where, state="running"):
    return RankResult(rank=rank, local_rank=rank, node_rank=0, state=state, blocked_at=where)


def test_timeout_report_names_the_split_collective():
    result = RunResult(ranks=[_blocked(0, "cell line 6: dist.all_reduce(t) (in all_reduce)"),
                              _blocked(1, "cell line 7: dist.barrier() (in barrier)")],
                       world_size=2, log_dir="/tmp")
    text = diagnosis.timeout_report(6, result)
    assert text.startswith("timed out after 6 s. rank 0 blocked at cell line 6: dist.all_reduce(t) "
                           "(in all_reduce); rank 1 blocked at cell line 7: dist.barrier() (in barrier).")
    assert "Hint: the ranks are not all in the same collective" in text
    # all ranks at the same line (a slow step, a deadlock on all ranks) or no collective: no such hint
    same = RunResult(ranks=[_blocked(0, "cell line 4: dist.barrier() (in barrier)"),
                            _blocked(1, "cell line 4: dist.barrier() (in barrier)")],
                     world_size=2, log_dir="/tmp")
    loop = RunResult(ranks=[_blocked(0, "cell line 4: x += 1"), _blocked(1, "cell line 3: while True:")],
                     world_size=2, log_dir="/tmp")
    assert "Hint" not in diagnosis.timeout_report(6, same)
    assert "Hint" not in diagnosis.timeout_report(6, loop)
    alone = RunResult(ranks=[_blocked(0, "cell line 5: dist.all_reduce(t) (in all_reduce)"),
                             _blocked(1, None, state=OK)], world_size=2, log_dir="/tmp")
    assert "Hint: the ranks are not all" in diagnosis.timeout_report(6, alone)


def test_timeout_report_says_a_rank_its_launcher_had_not_started_yet():
    """A Ray or torchrun launch on a loaded machine: the timeout came before torchrun started a rank;
    'still running' would be untrue."""
    result = RunResult(ranks=[_blocked(0, None, state="starting"), _blocked(1, None)], world_size=2, log_dir="/tmp")
    assert diagnosis.timeout_report(25, result) == \
        "timed out after 25 s. rank 0 not started yet; rank 1 still running (no stack)."


def test_idle_report_carries_the_same_hint():
    ranks = [_blocked(0, "cell line 6: dist.all_reduce(t) (in all_reduce)"),
             _blocked(1, "cell line 7: dist.barrier() (in barrier)")]
    result = RunResult(ranks=ranks, world_size=2, log_dir="/tmp")
    text = diagnosis.idle_report(30, result, ranks)
    assert text.startswith("warning: no output from any rank for 30 s")
    assert "Hint: the ranks are not all in the same collective" in text
    assert text.endswith("(use --timeout SECONDS to stop such a cell automatically)")


def test_add_hints_reads_only_the_tail_of_a_huge_stderr(tmp_path):
    """A rank that wrote a huge stderr (NCCL_DEBUG=INFO) costs the kernel the last 64 KB at the
    end of the launch, not the log's size (issue #37 point 11): a 64 MB log, sparse on disk."""
    import tracemalloc

    err = tmp_path / "rank0.stderr"
    with open(err, "wb") as f:
        f.truncate(64 << 20)
        f.seek(0, os.SEEK_END)
        f.write(b"\nRuntimeError: " + REAL_TEXTS["peer_closed"].encode() + b"\n")
    failed = RankResult(rank=0, local_rank=0, node_rank=0, state="failed", cause="exited with code 1",
                        stderr_path=str(err))
    tracemalloc.start()
    try:
        diagnosis.add_hints(RunResult(ranks=[failed], world_size=1, log_dir=str(tmp_path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{peak / 2**20:.0f} MB read into the kernel"
    assert "another rank ended" in failed.hint
    assert failed.cause.startswith("exited with code 1: RuntimeError: ")


def test_name_cell_on_a_traceback_and_a_faulthandler_dump():
    script = "/nb/.nbddp-1.py"
    source = "# %%ddp\nimport time\ntime.sleep(9)\n"
    tb = (f'Traceback (most recent call last):\n  File "{script}", line 3, in <module>\n    time.sleep(9)\n'
          "KeyboardInterrupt\n")
    assert name_cell(tb, script, "Cell In[4]") == tb.replace(f'File "{script}"', "Cell In[4]")
    dump = f'Thread 0x1 (most recent call first):\n  File "{script}", line 3 in <module>\n'
    assert name_cell(dump, script, "Cell In[4]", source) == \
        "Thread 0x1 (most recent call first):\n  Cell In[4], line 3 in <module>\n      time.sleep(9)\n"
    other = '  File "/usr/lib/python3.11/x.py", line 3 in f\n'
    assert name_cell(other, script, "Cell In[4]", source) == other
    assert name_cell(tb, script, None) == tb


def test_name_cell_ipython_keeps_ipythons_colours_and_names_the_cell_as_a_plain_cell_does():
    script = "/nb/.nbddp-1.py"
    coloured = (f"\x1b[0;36mFile \x1b[0;32m{script}:3\x1b[0m\n\x1b[0;32m----> 3\x1b[0m f()\n\n"
                f"\x1b[0;36mFile \x1b[0;32m{script}:2\x1b[0m, in \x1b[0;36mf\x1b[0;34m()\x1b[0m\n"
                "\x1b[0;36mFile \x1b[0;32m/usr/lib/python3.11/x.py:2\x1b[0m, in g()\n")
    named = name_cell_ipython(coloured, script, "Cell In[4]")
    assert named.count("\x1b[0;36mCell \x1b[0;32mIn[4], line ") == 2, named
    assert "In[4], line 3\x1b[0m\n" in named and "In[4], line 2\x1b[0m, in " in named
    assert "/usr/lib/python3.11/x.py:2" in named and script not in named  # other files keep their name
    plain = f"File {script}:3\n----> 3 f()\n"
    assert name_cell_ipython(plain, script, "Cell In[12]") == "Cell In[12], line 3\n----> 3 f()\n"
    assert name_cell_ipython(plain, script, 'File "/logs/launch-1/cell.py"') == \
        "File /logs/launch-1/cell.py:3\n----> 3 f()\n"  # nbddp.run(source): the copy that outlives the script
    assert name_cell_ipython(plain, script, None) == plain
