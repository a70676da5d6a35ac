"""A class on one server: K students each run the same lessons at the same moment, as a class
does on a JupyterHub node (under papermill, so each lesson runs in a kernel of its own). Not
part of the CI suite (tests/kernel/test_class_load.py runs a small version of it).

    .venv/bin/python benchmarks/class_load.py                      # 8 students, lessons 00-05
    .venv/bin/python benchmarks/class_load.py --kernels 2 --lessons 00,01 --private
    .venv/bin/python benchmarks/class_load.py --users --private   # as root: a user per student

First each lesson runs alone (its solo time), then K students at once, each running the lessons
in order. It checks that every lesson passed for every student (the lessons' own check cells
assert their results, so ranks that met another kernel's store would fail them), that with
``--private`` each kernel's ranks were in a network namespace of their own (a cell added after
the lesson's ``%load_ext`` and one at its end print it and the time; two kernels may see the
same number only one after the other, as the kernel frees it when it ends), and that nothing was left afterwards: no
process of any kernel, no log folder, no pushed file. It prints each lesson's solo time next to its times under load,
and exits 1 if any check failed.

Different users (``--users``, as root): each student's kernel runs as a user of its own
(``nbddp-student0``, ... created for the run and removed after it), as on a JupyterHub node. The
interpreter and the notebooks must then be usable by other users: a checkout whose venv is made
from a Python outside /root (for example a copy of the interpreter under /opt); the script says
so and stops where they are not.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
KERNEL = "nbddp-class"
NET_CELL = ("%%ddp -n 1 --fresh --output text\n"
            "import os, time\nprint('NBDDP_NET', os.readlink('/proc/self/ns/net'), time.time())")


def lesson_files(numbers: list[str]) -> list[str]:
    files = []
    for number in numbers:
        found = sorted(glob.glob(os.path.join(NOTEBOOKS, f"{number}_*.ipynb")))
        if not found:
            raise SystemExit(f"class_load: no lesson {number} in {NOTEBOOKS}")
        files.append(found[0])
    return files


def kernelspec(folder: str, private: bool, marker: str, tmp: str, extra_env: dict) -> str:
    """A JUPYTER_PATH entry whose kernel is this interpreter (with NBDDP_PRIVATE_NET=1 if
    asked). Its kernels' temporary folder is ``tmp`` and their processes carry ``marker`` in
    their environment, so what they leave is told apart from other work on the machine."""
    spec_dir = os.path.join(folder, "kernels", KERNEL)
    os.makedirs(spec_dir, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "nbddp class", "language": "python",
            "env": {"NBDDP_CLASS_RUN": marker, "TMPDIR": tmp}}
    if private:
        spec["env"]["NBDDP_PRIVATE_NET"] = "1"
    spec["env"].update(extra_env)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump(spec, f)
    return folder


def _executed():
    """notebooks/executed.py as a module (its ipc_kernel())."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lessons_executed", os.path.join(NOTEBOOKS, "executed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student(lessons: list[str], out_dir: str) -> None:
    """One kernel's run (a subprocess of its own): the lessons in order, one JSON line each."""
    import nbformat
    import papermill

    executed = _executed()
    for original in lessons:
        name = os.path.basename(original)
        dst = os.path.join(out_dir, name)
        work = tempfile.mkdtemp(prefix="lesson-", dir=out_dir)
        nb = nbformat.read(original, as_version=4)
        # where this kernel's ranks were, and when: right after %load_ext and at the end, so the
        # network is known to be alive (held by this kernel's forkserver) from one to the other
        loads = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "%load_ext nbddp" in c.source]
        if loads:
            nb.cells.insert(loads[0] + 1, nbformat.v4.new_code_cell(NET_CELL))
        nb.cells.append(nbformat.v4.new_code_cell(NET_CELL))
        src = os.path.join(work, name)
        nbformat.write(nb, src)
        started = time.monotonic()
        error = ""
        try:
            with executed.ipc_kernel() as config:  # three kernels started at once: no TCP port race
                papermill.execute_notebook(src, dst, kernel_name=KERNEL, cwd=work, progress_bar=False, config=config,
                                           request_save_on_cell_execute=False, execution_timeout=600)
        except Exception as exc:  # reported, the next lesson still runs
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        elapsed = time.monotonic() - started
        seen = []
        if os.path.exists(dst):
            text = json.dumps(nbformat.read(dst, as_version=4).cells)
            seen = [(net, float(t)) for net, t in re.findall(r"NBDDP_NET (net:\[\d+\]) ([\d.]+)", text)]
        times = [t for _, t in seen] or [time.time()]
        print(json.dumps({"lesson": name, "seconds": round(elapsed, 2), "error": error,
                          "nets": sorted({net for net, _ in seen}),
                          "started": min(times), "ended": max(times)}), flush=True)


STUDENT = "nbddp-student{}"


def make_users(count: int) -> list[str]:
    """``count`` local users for the students, created where missing (root only); each must be
    able to run this interpreter, or the run stops here saying why."""
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"):
        raise SystemExit("class_load: --users needs root, runuser and useradd")
    users = [STUDENT.format(i) for i in range(count)]
    for user in users:
        if subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)
    probe = subprocess.run(["runuser", "-u", users[0], "--", sys.executable, "-c", "import nbddp, papermill"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        remove_users(users)
        raise SystemExit(f"class_load: user {users[0]} cannot run {sys.executable} with nbddp "
                         f"({(probe.stderr.strip().splitlines() or ['?'])[-1]}); run this from a checkout "
                         f"whose venv other users can use (its Python outside /root)")
    return users


def remove_users(users: list[str]) -> None:
    for user in users:
        subprocess.run(["userdel", user], capture_output=True)


def run_students(count: int, lessons: list[str], out_root: str, env: dict, deadline_s: float,
                 marker: str, left: list, users: list[str] | None = None) -> list[list[dict]]:
    """``count`` students at once, each running every lesson; their reports, per student. At
    the deadline every process of the run (its students and whatever carries ``marker``) is
    killed, and the lessons not reported count as failed; what was still running then is added
    to ``left``."""
    procs = []
    for i in range(count):
        out_dir = os.path.join(out_root, f"student-{i}")
        os.makedirs(out_dir, exist_ok=True)
        command = [sys.executable, os.path.abspath(__file__), "--student", out_dir, *lessons]
        if users:  # the student's own account, home and Jupyter folders, as a hub gives each
            shutil.chown(out_dir, users[i], users[i])
            os.chmod(out_dir, 0o700)
            own = {"HOME": out_dir, "USER": users[i], "LOGNAME": users[i],  # runuser resets HOME
                   "JUPYTER_RUNTIME_DIR": os.path.join(out_dir, ".runtime"),
                   "JUPYTER_DATA_DIR": os.path.join(out_dir, ".data")}
            command = ["runuser", "-u", users[i], "--", "env", *(f"{k}={v}" for k, v in own.items())] + command
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
    reports = []
    end = time.monotonic() + deadline_s
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill([proc.pid] + [pid for pid in marked_pids(marker) if _is_kernel(pid)])
            out, _ = proc.communicate()
            time.sleep(10)  # what nbddp ends by itself when its kernel dies (the log janitor too)
            stragglers = marked_pids(marker)  # the rest would be left: report it, and end it
            left.extend(f"process {pid} (still running 10 s after its kernel was killed)" for pid in stragglers)
            _kill(stragglers)
        reports.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    return reports


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def _is_kernel(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ipykernel_launcher" in f.read()
    except OSError:
        return False


def marked_pids(marker: str) -> list[int]:
    """The processes of this run's kernels (they carry ``marker`` in their environment)."""
    needle, found = f"NBDDP_CLASS_RUN={marker}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def someone_elses(push_folder: str, ours: set) -> bool:
    """A pushed-values folder (``nbddp-push-<kernel pid>-…``) of a kernel that still runs and is
    not this run's: /dev/shm is shared, and another kernel on the machine (a test beside this one)
    keeps its folder while it lives."""
    found = re.match(r"nbddp-push-(\d+)-", os.path.basename(push_folder))
    return bool(found) and int(found.group(1)) not in ours and os.path.exists(f"/proc/{found.group(1)}")


def leftovers(marker: str, tmp: str, before: set) -> list[str]:
    """What the run's kernels left: any process carrying ``marker``, log folders in ``tmp``,
    pushed files (new ones that stay count, but for those of other kernels still running)."""
    left = [p for p in glob.glob(os.path.join(tmp, "nbddp-*"))]
    marked = marked_pids(marker)  # one pass over /proc for the folders and the processes
    ours = set(marked)
    left += [p for p in glob.glob("/dev/shm/nbddp-push-*") if p not in before and not someone_elses(p, ours)]
    for pid in marked:
        try:
            with open(f"/proc/{pid}/comm") as c:
                left.append(f"process {pid} ({c.read().strip()})")
        except OSError:
            continue
    return left


def wait_for_nothing_left(marker: str, tmp: str, before: set, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(marker, tmp, before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def run(kernels: int, numbers: list[str], private: bool, solo: bool = True, out_root: str | None = None,
        deadline_s: float = 3600.0, kernel_env: dict | None = None, users: list[str] | None = None) -> dict:
    """The whole check; returns {"solo": {lesson: s}, "load": {lesson: [s per kernel]},
    "failures": [...], "left": [...]}."""
    lessons = lesson_files(numbers)
    out_root = out_root or tempfile.mkdtemp(prefix="class-load-")
    env = dict(os.environ)
    marker, tmp = uuid.uuid4().hex, os.path.join(out_root, "tmp")
    os.makedirs(tmp, exist_ok=True)
    if users:  # a shared /tmp-like folder, and the run's folder passable by the students
        os.chmod(tmp, 0o1777)
        for folder in (out_root, os.path.join(out_root, "solo"), os.path.join(out_root, "class")):
            os.makedirs(folder, exist_ok=True)
            os.chmod(folder, 0o755)
    env["JUPYTER_PATH"] = kernelspec(os.path.join(out_root, "jupyter"), private, marker, tmp, kernel_env or {}) + (
        os.pathsep + env["JUPYTER_PATH"] if env.get("JUPYTER_PATH") else "")
    before = set(glob.glob("/dev/shm/nbddp-push-*"))
    failures, stragglers = [], []
    solo_times = {}
    if solo:
        for report in run_students(1, lessons, os.path.join(out_root, "solo"), env, deadline_s, marker,
                                   stragglers, users)[0]:
            solo_times[report["lesson"]] = report["seconds"]
            if report["error"]:
                failures.append(f"solo {report['lesson']}: {report['error']}")
    reports = run_students(kernels, lessons, os.path.join(out_root, "class"), env, deadline_s, marker,
                           stragglers, users)
    load: dict[str, list[float]] = {}
    owners: dict[str, list] = {}  # network namespace -> the runs whose ranks were in it
    for i, kernel_reports in enumerate(reports):
        if len(kernel_reports) != len(lessons):
            failures.append(f"student {i}: reported {len(kernel_reports)} of {len(lessons)} lessons")
        for report in kernel_reports:
            run_name = f"student {i} {report['lesson']}"
            load.setdefault(report["lesson"], []).append(report["seconds"])
            if report["error"]:
                failures.append(f"{run_name}: {report['error']}")
            if private and len(report["nets"]) != 1:
                failures.append(f"{run_name}: ranks in networks {report['nets']}, not one of its own")
            for net in report["nets"] if private else ():
                # from its first sighting to its last the network is held by this kernel; once the
                # kernel ends its number is free again: only windows that overlap count
                for other, started, ended in owners.get(net, []):
                    if started < report["ended"] and report["started"] < ended:
                        failures.append(f"{run_name}: ranks in the network of {other}, at the same time")
                owners.setdefault(net, []).append((run_name, report["started"], report["ended"]))
    left = stragglers + wait_for_nothing_left(marker, tmp, before)
    return {"solo": solo_times, "load": load, "failures": failures, "left": left, "out": out_root}


def table(result: dict, kernels: int) -> str:
    lines = [f"| lesson | solo (s) | {kernels} students at once: median (max) s |", "|---|---|---|"]
    for lesson, times in result["load"].items():
        solo = result["solo"].get(lesson)
        lines.append(f"| {lesson} | {solo if solo is not None else '-'} | "
                     f"{statistics.median(times):.1f} ({max(times):.1f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=8, help="students at once (default 8)")
    p.add_argument("--lessons", default="00,01,02,03,04,05", help="lesson numbers, comma-separated")
    p.add_argument("--private", action="store_true", help="kernels with NBDDP_PRIVATE_NET=1")
    p.add_argument("--no-solo", action="store_true", help="skip the solo runs")
    p.add_argument("--users", action="store_true",
                   help="as root: each student's kernel as a user of its own (created and removed)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a variable for every kernel (repeatable), e.g. NBDDP_PRELOAD=0")
    p.add_argument("--student", help=argparse.SUPPRESS)
    p.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.student:
        student(args.files, args.student)
        return 0
    started = time.monotonic()
    kernel_env = dict(item.split("=", 1) for item in args.env)
    users = make_users(args.kernels) if args.users else None
    try:
        result = run(args.kernels, args.lessons.split(","), args.private, solo=not args.no_solo,
                     kernel_env=kernel_env, users=users)
    finally:
        if users:
            remove_users(users)
    cores = os.cpu_count()
    print(f"class load: {args.kernels} students at once, lessons {args.lessons}, {cores} cores, "
          f"private network: {'yes' if args.private else 'no'}, "
          f"users: {'one per student' if users else 'this one'}, kernel env {kernel_env or '-'}, "
          f"{time.monotonic() - started:.0f} s in all")
    print(table(result, args.kernels))
    for failure in result["failures"]:
        print("FAILED:", failure)
    for item in result["left"]:
        print("LEFT:", item)
    print("executed notebooks:", result["out"])
    return 1 if result["failures"] or result["left"] else 0


if __name__ == "__main__":
    sys.exit(main())
