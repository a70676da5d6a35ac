"""%%ddp gives every rank the environment real torchrun gives it: same keys, same values
(apart from the per-launch port, run id and error-file path). Both sides run for real."""
import json
import os
import socket
import subprocess
import sys

import pytest

from nbddp.core.envvars import PER_LAUNCH_KEYS

DUMP = """
import json, os, sys
out = os.environ["DUMP_DIR"]
with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv1": sys.argv[1:], "name": __name__}, f)
"""


# The one variable nbddp's ranks get that torchrun's do not (issue #37.6): torch's compile cache
# in nbddp's private folder, not the /tmp/torchinductor_<user> any user can create first.
NBDDP_ADDS = ("TORCHINDUCTOR_CACHE_DIR",)


def _added(env: dict, base: dict) -> dict:
    """The variables a launcher added (or changed) relative to the environment it started in."""
    return {k: v for k, v in env.items() if base.get(k) != v}


def _torchrun(tmp_path, nproc, nnodes=1):
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    out = tmp_path / "torchrun"
    out.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    base["DUMP_DIR"] = str(out)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        procs = [subprocess.Popen(torchrun + ["--standalone", f"--nproc-per-node={nproc}", str(script), "x"],
                                  env=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen(torchrun + [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}",
                                              f"--node-rank={node}", "--master-addr=localhost",
                                              f"--master-port={port}", str(script), "x"],
                                  env=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for node in range(nnodes)]
    for p in procs:
        output = p.communicate(timeout=120)[0].decode()
        assert p.returncode == 0, output
    return base, {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}


def _ddp(kernel, tmp_path, line):
    out = tmp_path / "ddp"
    out.mkdir()
    kernel.ok(f"import os; os.environ.pop('OMP_NUM_THREADS', None); os.environ['DUMP_DIR'] = {str(out)!r}")
    base = json.loads(kernel.ok("import json, os; print(json.dumps(dict(os.environ)))").stdout)
    kernel.ok(f"%%ddp {line} -- x\n{DUMP}")
    return base, {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")}


@pytest.mark.parametrize("torchrun_shape, ddp_line", [
    ((2, 1), "-n 2"),
    ((2, 2), "-n 4 --nnodes 2"),
])
def test_same_variables_and_values_as_torchrun(kernel, tmp_path, torchrun_shape, ddp_line):
    t_base, t_ranks = _torchrun(tmp_path, *torchrun_shape)
    d_base, d_ranks = _ddp(kernel, tmp_path, ddp_line)
    assert sorted(t_ranks) == sorted(d_ranks) == list(range(torchrun_shape[0] * torchrun_shape[1]))
    for rank in t_ranks:
        t_env = _added(t_ranks[rank]["env"], t_base)
        d_env = _added(d_ranks[rank]["env"], d_base)
        for key in NBDDP_ADDS:  # nbddp's deliberate additions, where the user set none
            assert key in d_env or key in d_base, f"rank {rank}: no {key}"
            d_env.pop(key, None)
        assert sorted(d_env) == sorted(t_env), f"rank {rank}: key sets differ"
        for key in t_env:
            if key in PER_LAUNCH_KEYS:
                continue
            assert d_env[key] == t_env[key], f"rank {rank}: {key} = {d_env[key]!r}, torchrun {t_env[key]!r}"
        assert d_ranks[rank]["argv1"] == t_ranks[rank]["argv1"] == ["x"]
        assert d_ranks[rank]["name"] == t_ranks[rank]["name"] == "__main__"
    assert t_ranks[0]["env"]["OMP_NUM_THREADS"] == d_ranks[0]["env"]["OMP_NUM_THREADS"] == "1"
