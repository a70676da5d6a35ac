"""What the kernel and one of its ranks agree on, without a process: the RankJob built once for
fresh and pool ranks (nbddp/sources/rankjobs.py, nbddp/core/job.py) and the per-rank file
names (nbddp/core/rankfiles.py). The worker applying a job is exercised by every kernel test."""
from __future__ import annotations

import fnmatch
import io
import os
import pickle
import sys

import pytest

from nbddp.core import job as rankjob, messages as msg, placement
from nbddp.core.job import Cell, RankJob
from nbddp.core.rankfiles import RankFiles
from nbddp.core.spec import LaunchSpec
from nbddp.forkserver import preload
from nbddp.sources.rankjobs import rank_jobs


def _jobs(spec, root="/logs/launch-1", **kw):
    cell = Cell("print(1)\n", "/nb/.nbddp-1.py", "Cell In[3]", {"path": "/dev/shm/x"}, ["loss"])
    return rank_jobs(spec, RankFiles(root), cell, master_port=29511, cwd="/nb", base_env={"HOME": "/root"},
                     plan=placement.plan(spec, 0), **kw)


# ------------------------------------------------------------------ RankJob
def test_each_rank_gets_its_torchrun_environment_argv_and_files():
    spec = LaunchSpec(nproc_per_node=2, nnodes=2, node_rank=0, legacy_launch="dash", script_args=("--lr", "3"))
    jobs = _jobs(spec)
    assert [j.rank for j in jobs] == [0, 1, 2, 3]
    j = jobs[3]
    assert (j.env["RANK"], j.env["LOCAL_RANK"], j.env["WORLD_SIZE"], j.env["MASTER_PORT"]) == ("3", "1", "4", "29511")
    assert j.env["TORCHELASTIC_ERROR_FILE"] == "/logs/launch-1/rank3.error.json" and j.env["HOME"] == "/root"
    assert len({job.env["TORCHELASTIC_RUN_ID"] for job in jobs}) == 1  # one run id for the launch
    assert j.argv == ["/nb/.nbddp-1.py", "--local-rank=1", "--lr", "3"]
    assert (j.stack_path, j.sigint_path) == ("/logs/launch-1/rank3.stacks", "/logs/launch-1/rank3.sigint")
    assert (j.cwd, j.sys_path, j.backend, j.pool, j.func) == ("/nb", sys.path, "gloo", False, None)
    assert j.cell.label == "Cell In[3]" and j.cell.pull == ["loss"]


def test_fresh_and_pool_ranks_get_the_same_job_and_both_forget_stale_modules(monkeypatch):
    monkeypatch.setattr(preload, "stale", lambda: ["mymodel"])  # edited since the forkserver imported it
    spec = LaunchSpec(nproc_per_node=2)
    fresh, pool = _jobs(spec), _jobs(spec, pool=True)
    assert [j.forget for j in fresh + pool] == [["mymodel"]] * 4  # the pool's job used to lack it
    assert [type(j) for j in fresh + pool] == [RankJob] * 4
    assert [j.pool for j in pool] == [True, True]
    assert [(f.rank, f.env.keys()) for f in fresh] == [(p.rank, p.env.keys()) for p in pool]


def test_a_job_is_one_pickle_the_rank_reads_with_nbddp_core_job_alone():
    job = _jobs(LaunchSpec(nproc_per_node=1), func={"name": "train", "payload": b"..."})[0]
    data = rankjob.dumps(job)
    assert rankjob.loads(data) == job
    needed = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            needed.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(data)).load()
    assert needed == {("nbddp.core.job", "RankJob"), ("nbddp.core.job", "Cell")}


def test_something_else_on_the_job_pipe_is_refused():
    with pytest.raises(TypeError, match="not a RankJob"):
        rankjob.loads(pickle.dumps({"rank": 0}))


def test_message_kinds_are_distinct_plain_strings():
    kinds = {k: v for k, v in vars(msg).items() if k.isupper()}
    assert all(type(v) is str for v in kinds.values())
    payloads = ("NO_FRONTEND", "NOT_FIRST")  # and DONE_*, ASK_*: values inside a message
    pipe = [v for k, v in kinds.items() if not k.startswith(("DONE_", "ASK_")) and k not in payloads]
    assert len(pipe) == len(set(pipe)) == 19
    asked = [msg.ASK_INPUT, msg.ASK_DEBUGGER, msg.ASK_POST_MORTEM, msg.NO_FRONTEND, msg.NOT_FIRST]
    assert len(set(asked)) == len(asked)


# ---------------------------------------------------------------- RankFiles
def test_rank_files_have_the_names_the_readme_and_users_know():
    files = RankFiles("/logs/launch-7")
    assert [files.stdout(2), files.stderr(2), files.log(2, "stdout"), files.stacks(2), files.sigint(2),
            files.error_file(2)] == ["/logs/launch-7/rank2.stdout", "/logs/launch-7/rank2.stderr",
                                     "/logs/launch-7/rank2.stdout", "/logs/launch-7/rank2.stacks",
                                     "/logs/launch-7/rank2.sigint", "/logs/launch-7/rank2.error.json"]
    assert files.cell_copy == "/logs/launch-7/cell.py"


def test_torchrun_status_files_sit_in_the_status_folder_and_match_its_glob():
    status = RankFiles(RankFiles("/logs/launch-7").status_dir)
    assert status.root == "/logs/launch-7/status"
    assert status.status(12) == "/logs/launch-7/status/rank12.json"
    assert fnmatch.fnmatch(status.status(12), status.status_glob)
    assert not fnmatch.fnmatch(status.stacks(12), status.status_glob)
    assert os.path.dirname(status.stacks(12)) == status.root
