"""The Ray driver of one ``--launcher ray`` cell (``python -m nbddp.raynode CONFIG.json``), the
launch's agent as srun is Slurm's: it connects to the cluster (or starts a local Ray that ends with
it), reserves one STRICT_SPREAD placement-group bundle per node, has a NodeAgent actor in each start
that node's torchrun (c10d on node 0), and writes every node's ``[rankN]:`` lines to its own output.
Signals are recorded by the handler and passed on by the main loop; a failed node stops the others
(srun's --kill-on-bad-exit); however it ends, torchruns, actors and placement group go with it, and
its own reasons to stop are ``nbddp: `` lines on stderr (docs/howto/cluster.md, "Ray")."""
from __future__ import annotations

import json
import logging
import secrets
import signal
import sys
import time

from nbddp.core import rayjob

SAYS = "nbddp: "
CALL_WAIT_S = 60.0     # for one actor call
STOP_WAIT_S = 10.0     # torchrun's own shutdown, before SIGKILL
ENDPOINT = rayjob.ENDPOINT  # the word of the config's argv the rendezvous endpoint replaces

_received: list[int] = []


def _record(signum, frame) -> None:
    _received.append(signum)


def say(text: str) -> None:
    sys.stderr.write(SAYS + text + "\n")
    sys.stderr.flush()


def _write(stream, data: bytes) -> None:
    if data:
        stream.buffer.write(data)
        stream.buffer.flush()


def main(config_path: str) -> int:
    with open(config_path) as f:
        return run(json.load(f))


def run(cfg: dict) -> int:
    """One launch as ``cfg`` describes it (nbddp/sources/ray.py writes it; an exported Ray job,
    nbddp/export.py, holds it); the exit code."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from nbddp.raynode.nodeagent import NodeAgent

    address = cfg["address"]
    try:
        if address:
            env = {"working_dir": cfg["working_dir"]} if cfg.get("working_dir") else None
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                     runtime_env=env)  # "auto": a Ray job's own cluster
        else:
            _start_local_ray(ray, cfg["local_cpus"])
    except Exception as exc:
        say(f"cannot connect to the Ray cluster at {address or 'a new local Ray'}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _record)
    nnodes, cpus, gpus = cfg["nnodes"], cfg["cpus"], cfg["gpus"]
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    pg, actors = None, []
    try:
        pg = placement_group([dict(bundle) for _ in range(nnodes)], strategy="STRICT_SPREAD")
        wait = cfg.get("place_wait", rayjob.PLACE_WAIT_S)
        if not _wait_ready(ray, pg.ready(), wait):
            if not _received:
                alive = [n for n in ray.nodes() if n.get("Alive")]
                say(f"the Ray cluster cannot place {nnodes} bundle(s) of {bundle} on {nnodes} different "
                    f"node(s) within {wait:g} s (STRICT_SPREAD; --rdzv-timeout waits longer); "
                    f"it has {len(alive)} node(s) alive: "
                    + "; ".join(f"{n.get('NodeManagerAddress')} {_res(n.get('Resources', {}))}" for n in alive))
            return 1
        remote = ray.remote(NodeAgent)
        actors = [remote.options(num_cpus=cpus, num_gpus=gpus, max_concurrency=1,
                                 scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
                  for i in range(nnodes)]
        nodes = ray.get([a.node.remote() for a in actors], timeout=CALL_WAIT_S)
        port = cfg["port"] or ray.get(actors[0].free_port.remote(), timeout=CALL_WAIT_S)
        endpoint = f"{_host(nodes[0]['ip'])}:{port}"
        rdzv_id = secrets.token_hex(16)
        if cfg.get("nodes_file"):  # for the kernel and the user: which node runs what
            with open(cfg["nodes_file"], "w") as f:
                json.dump({"endpoint": endpoint, "nodes": nodes}, f)
        if _received:
            return 128 + _received[0]
        argv = [endpoint if word == ENDPOINT else word.replace(ENDPOINT, endpoint) for word in cfg["argv"]]
        starts = []
        for i, actor in enumerate(actors):
            env = dict(cfg["env"], PET_RDZV_ID=rdzv_id,
                       PET_RDZV_CONF=("is_host=true" if i == 0 else "is_host=false") + cfg["conf_tail"])
            starts.append(actor.start.remote(argv, env, cfg["cwd"], cfg["files"], cfg["dirs"]))
        ray.get(starts, timeout=CALL_WAIT_S)
        return _pump(ray, actors)
    except Exception as exc:
        say(f"the Ray launch failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return 1
    finally:
        _stop(ray, actors, pg, remove_placement_group)


def _pump(ray, actors) -> int:
    """Every node's output to this process's stdout/stderr until every torchrun has ended; the
    signals received passed on, and SIGTERM to the others once a node's torchrun failed. The
    exit code: the first failed node's."""
    codes: dict[int, int] = {}
    passed, stopping = 0, False
    while len(codes) < len(actors):
        while passed < len(_received):
            sig = _received[passed]
            passed += 1
            for i, actor in enumerate(actors):
                if i not in codes:
                    actor.signal.remote(sig)
        live = [i for i in range(len(actors)) if i not in codes]
        try:
            got = ray.get([actors[i].read.remote() for i in live], timeout=CALL_WAIT_S)
        except ray.exceptions.RayActorError as exc:
            say(f"a node's Ray actor died, so its torchrun and ranks ended: {str(exc).splitlines()[0]}")
            return 1
        for i, (out, err, rc) in zip(live, got, strict=True):
            _write(sys.stdout, out)
            _write(sys.stderr, err)
            if rc is not None:
                codes[i] = rc
        if any(codes.values()) and not stopping and len(codes) < len(actors):
            stopping = True  # a failed node stops the others (srun's --kill-on-bad-exit): their torchrun
            _received.append(signal.SIGTERM)  # would wait for it at its exit barrier for minutes
    failed = [rc for i, rc in sorted(codes.items()) if rc != 0]
    return failed[0] if failed else 0


def _stop(ray, actors, pg, remove_placement_group) -> None:
    """Every torchrun ended, the actors killed, the placement group removed, Ray disconnected."""
    try:
        if actors:
            ray.get([a.stop.remote(STOP_WAIT_S) for a in actors], timeout=STOP_WAIT_S + 10)
    except Exception:
        pass
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:
            pass
    if pg is not None:
        try:
            remove_placement_group(pg)
        except Exception:
            pass
    try:
        ray.shutdown()
    except Exception:
        pass


def _wait_ready(ray, ref, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not _received:
        ready, _ = ray.wait([ref], timeout=0.5)
        if ready:
            return True
    return False


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _res(resources: dict) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU"))


LOCAL_TRIES = 2  # Ray gives a new node's raylet 30 s to register, fixed; a loaded machine can miss it once


def _start_local_ray(ray, cpus: int) -> None:
    """A local Ray for this cell: tried again once where Ray's own start timed out (its raylet
    did not register in Ray's fixed 30 s, as happens on a busy 2-core machine), saying so."""
    for attempt in range(1, LOCAL_TRIES + 1):
        try:
            ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
            return
        except Exception as exc:
            if attempt == LOCAL_TRIES or "timed out during startup" not in str(exc):
                raise
            ray.shutdown()  # what the first try started
            say("the local Ray did not start within Ray's 30 s (a busy machine?); trying once more")
