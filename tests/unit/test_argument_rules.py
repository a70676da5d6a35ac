"""The argument rules (nbddp/core/launchrules.py, nbddp/core/linecommands.py) and the Python
API's refusals, without a kernel or any process: every row of the docs' table of bad magic
input, checked against the rules directly, with the message the docs show; and nbddp.run / nbddp.Pool raising the same
DDPUsageError (a ValueError, never IPython's UsageError) before anything starts."""
import re
import socket
from pathlib import Path

import pytest

import nbddp
import support
from nbddp import DDPUsageError
from nbddp.core import launchrules as rules, linecommands, settings
from nbddp.core.ddpline import parse_line
from nbddp.core.spec import LaunchSpec
from nbddp.forkserver import tcpstore
from nbddp.sources import rendezvous

ROOT = support.ROOT


def docs_rows() -> dict[str, str]:
    """The docs' table of bad magic input (docs/howto/troubleshooting.md, the list-table named
    ``bad-input``): first column → second column, each cell's wrapped lines joined again."""
    text = (ROOT / "docs" / "howto" / "troubleshooting.md").read_text()
    table = text[text.index(":name: bad-input"):].split("```", 1)[0]
    rows: list[list[str]] = []
    for line in table.splitlines()[1:]:
        if line.startswith("* - "):
            rows.append([line[4:].strip()])
        elif line.startswith("  - "):
            rows[-1].append(line[4:].strip())
        elif line.startswith("    ") and rows:
            rows[-1][-1] += " " + line.strip()
    return {row[0]: row[1] for row in rows[1:]}  # the first row is the header


def held_port():
    """A port some other socket listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def port_in_use():
    sock, port = held_port()
    with sock:
        tcpstore.host_store("localhost", port)


def pool_spec():
    return parse_line("-n 3")


def also(call):
    """A further case of a row, whose exact message the docs do not show."""
    call.also = True
    return call


# first column of the docs' row → calls that must each raise the row's error, with a message
# the row shows (unless marked ``also``)
CASES = {
    "`-n 0` / `-n x`": [lambda: parse_line("-n 0"), lambda: parse_line("-n x")],
    "`--bogus`": [lambda: parse_line("--bogus")],
    "`-n 4 --nnodes 3`": [lambda: parse_line("-n 4 --nnodes 3")],
    "`--master-port 70000`": [lambda: parse_line("--master-port 70000")],
    "`--master-port P`, P held by another process": [port_in_use],
    "`--env NOEQUALS`": [lambda: parse_line("--env NOEQUALS")],
    "`--timeout -1`": [lambda: parse_line("--timeout -1")],
    "`--env MASTER_PORT=29500` (or `RANK`, `WORLD_SIZE`, …)": [
        lambda: parse_line("--env MASTER_PORT=29500"), also(lambda: parse_line("--env RANK=0")),
        also(lambda: parse_line("--env WORLD_SIZE=2"))],
    "`--backend foo` / `--start-method fork`": [lambda: parse_line("--backend foo"),
                                                also(lambda: parse_line("--start-method fork")),
                                                also(lambda: parse_line("--same-lines both")),
                                                also(lambda: nbddp.run("pass", same_lines="both"))],
    "`-n 2 --ranks 5`": [lambda: parse_line("-n 2 --ranks 5")],
    "`--start-method spawn`, or a non-local `--master-addr`, with `NBDDP_PRIVATE_NET=1`": [
        lambda: rules.check_private_net(parse_line("--start-method spawn"), "NBDDP_PRIVATE_NET", True),
        lambda: rules.check_private_net(parse_line("--master-addr node0"), "NBDDP_PRIVATE_NET", False)],
    "a syntax error in the cell (a top-level `return`, `yield` or `await` too)": [
        lambda: rules.check_cell("# %%ddp -n 2\nx = 1\ny = (1,\n"), also(lambda: rules.check_cell("return 1\n")),
        also(lambda: rules.check_cell("yield 1\n")), also(lambda: rules.check_cell("await f()\n"))],
    "`-n 99999999999` (or more ranks than this machine runs: `-n 4000` on 2 cores)": [
        lambda: parse_line("-n 99999999999"), also(lambda: parse_line(f"-n {64 * 1024}"))],
    "`--master-addr 'node 0'` (or a label over 63 characters)": [
        lambda: parse_line("--master-addr 'node 0'"), also(lambda: parse_line("--master-addr " + "a" * 64))],
    "`--log-dir F`, F a file (or a folder this user cannot write, or one another user owns or can write)": [
        lambda: parse_line(f"--log-dir {Path(__file__)}")],
    '`nbddp.run(cell, master_port="29500")` (or `True`, `timeout="10"`, …)': [
        lambda: nbddp.run("pass", master_port="29500"), also(lambda: nbddp.run("pass", master_port=True)),
        also(lambda: nbddp.run("pass", timeout="10"))],
    "`-n 2 --pull x@5`": [lambda: parse_line("-n 2 --pull x@5")],
    "`--launcher torchrun --nnodes 2` (no meeting point) / `… --master-port P` without `--node-rank`": [
        lambda: parse_line("--launcher torchrun --nnodes 2"),
        lambda: parse_line("--launcher torchrun --nnodes 2 --master-port 2345")],
    "`--launcher torchrun --push x` (or `--pull`, or `slurm`)": [
        lambda: parse_line("--launcher torchrun --push x"), lambda: parse_line("--launcher torchrun --pull y"),
        also(lambda: parse_line("--launcher slurm --push x"))],
    "`--launcher torchrun --pdb`": [lambda: parse_line("--launcher torchrun --pdb"),
                                    also(lambda: parse_line("--launcher slurm --pdb"))],
    "`--slurm` without `--export`": [lambda: rules.choose_source(parse_line("--slurm"))],
    "`-n 2` (or `--backend`, `--env`, …) while a 3-rank pool runs": [
        lambda: rules.choose_source(parse_line("-n 2", shape=pool_spec()), pool=pool_spec()),
        also(lambda: rules.choose_source(parse_line("--backend nccl", shape=pool_spec()), pool=pool_spec())),
        also(lambda: rules.choose_source(parse_line("--env A=1", shape=pool_spec()), pool=pool_spec()))],
    "`%ddp_pool start --launcher torchrun` (also `restart`, `nbddp.Pool(launcher=...)`)": [
        lambda: linecommands.parse_pool_line("start --launcher torchrun", running=False, exists=False),
        lambda: linecommands.parse_pool_line("restart --launcher torchrun", running=True, exists=True),
        lambda: nbddp.Pool(n=2, launcher="torchrun")],
}


def test_every_row_of_the_docs_table_has_its_case():
    assert set(docs_rows()) == set(CASES)


@pytest.mark.parametrize("row", sorted(CASES))
def test_each_row_raises_the_docs_message_as_a_value_error(row):
    shown = docs_rows()[row]
    for call in CASES[row]:
        with pytest.raises(DDPUsageError) as info:
            call()
        assert isinstance(info.value, ValueError)
        message = str(info.value)
        first = message.split("\n")[0]
        generic = re.sub(r"MASTER_PORT \d+ is already", "MASTER_PORT P is already", first)
        generic = re.sub(r"cell line \d+", "cell line N", generic)
        generic = re.sub(r"--log-dir \S+:", "--log-dir F:", generic)
        without_prefix = generic.removeprefix("%%ddp: ")
        if not getattr(call, "also", False):
            assert f"`UsageError: {generic}" in shown or f"`{without_prefix}`" in shown, (row, message)
        if not row.startswith("a syntax error in the cell"):
            assert "\n" not in message, message  # one line


def test_the_syntax_error_shows_the_line_and_a_caret():
    with pytest.raises(DDPUsageError) as info:
        rules.check_cell("# %%ddp -n 2\nx = 1\ny = (1,\n")
    assert str(info.value) == ("%%ddp: cell line 3 has a syntax error, so no rank was started:\n"
                               "    y = (1,\n        ^\nSyntaxError: '(' was never closed")
    rules.check_cell("# %%ddp\nx = 1\n")


# ------------------------------------------------------------------ other rules
@pytest.mark.parametrize("line, words", [
    ("--node-rank 1", "--node-rank runs one node of a real multi-node job"),
    ("--launcher torchrun --nnodes 2 --master-port 2345 --node-rank 2", "--node-rank 2 must be below --nnodes 2"),
    ("--rdzv-endpoint h:1", "--rdzv-endpoint is for a real multi-node job"),
    ("--launcher torchrun --rdzv-endpoint 'a b'", "--rdzv-endpoint takes HOST[:PORT]"),
    ("--master-addr ''", "--master-addr must not be empty"),
    ("--export job.txt", "--export: the script name must end in .py"),
    ("-n 4 --nproc-per-node 3", "-n 4 disagrees with --nproc-per-node 3 x --nnodes 1 = 3"),
    ("'unclosed", "cannot split the line"),
])
def test_more_bad_lines(line, words):
    with pytest.raises(DDPUsageError, match=re.escape(words)):
        parse_line(line)


def test_good_lines_pass():
    assert parse_line("--launcher torchrun --nnodes 2 --rdzv-endpoint h:29400").nnodes == 2
    assert parse_line("--launcher torchrun --nnodes 2 --master-port 2345 --node-rank 1").node_rank == 1
    assert parse_line("-n 2 --pull x@1,y").pull == ("x@1", "y")
    assert parse_line("-h") is None  # argparse printed the help: nothing runs


def test_a_cell_on_the_pool_takes_its_shape_and_may_repeat_it():
    pool = pool_spec()
    for line in ("", "-n 3", "--ranks 2 --timeout 5", "--fresh -n 2"):
        spec = parse_line(line, shape=pool)
        assert rules.choose_source(spec, pool=pool) == ("local" if spec.fresh else "pool")
    assert rules.choose_source(parse_line("--launcher torchrun", shape=pool), pool=pool) == "torchrun"
    with pytest.raises(DDPUsageError, match="a pool of 3 ranks is running, so --nnodes cannot change"):
        rules.choose_source(parse_line("--nnodes 3", shape=pool), pool=pool)


def test_a_pool_that_is_not_ready_refuses_cells_but_not_fresh_ones():
    pool, cell = pool_spec(), parse_line("", shape=pool_spec())
    with pytest.raises(DDPUsageError, match=r"the pool is broken \(rank 1 died\); run %ddp_pool restart"):
        rules.choose_source(cell, pool=pool, pool_ready=False, why_broken="rank 1 died")
    with pytest.raises(DDPUsageError, match="no pool is running; start one"):
        rules.choose_source(cell, pool=pool, pool_ready=False)
    assert rules.choose_source(parse_line("--fresh"), pool=pool, pool_ready=False) == "local"


@pytest.mark.parametrize("facts, words", [
    (dict(func=True, launcher="torchrun"), "--launcher torchrun runs the cell as a script"),
    (dict(func=True, launcher="slurm"), "--launcher slurm runs the cell as a script"),
    (dict(push=True, launcher="torchrun"), "--push/--pull move values"),
    (dict(args=True), "args and kwargs are for a callable"),
    (dict(func=True, export="job.py"), "--export writes the cell's source"),
    (dict(func=True, pool=True), "a pool runs cells given as source text"),
    (dict(own_env=True, pool=True), "cwd and env_base are the pool's own"),
])
def test_what_a_source_cannot_take(facts, words):
    options = {k: facts.pop(k) for k in ("launcher", "export") if k in facts}
    pool = pool_spec() if facts.pop("pool", False) else None
    spec = rules.make_spec(**options) if pool is None else parse_line("", shape=pool)
    with pytest.raises(DDPUsageError, match=re.escape(words)):
        rules.choose_source(spec, pool=pool, **facts)


def test_pool_commands():
    parse = linecommands.parse_pool_line
    assert parse("status", running=False, exists=False) == linecommands.PoolCommand("status")
    assert parse("restart", running=True, exists=True) == linecommands.PoolCommand("restart")
    assert parse("start -n 2", running=False, exists=False).spec.world_size == 2
    for line, state, words in [
        ("", {}, "usage: %ddp_pool start"),
        ("launch", {}, "unknown command 'launch'"),
        ("start -n 2", dict(running=True, exists=True), "a pool is already running"),
        ("restart", dict(running=False, exists=False), "no pool to restart"),
        ("restart -n 2", dict(running=False, exists=False), "no pool to restart"),
        ("stop now", {}, "stop takes no options"),
        ("start -n 0", {}, "-n must be at least 1"),
    ]:
        facts = {"running": False, "exists": False, **state}
        with pytest.raises(DDPUsageError, match=re.escape(words)):
            parse(line, **facts)


def test_pool_restart_with_help_only_prints_it(capsys):
    order = linecommands.parse_pool_line("restart -h", running=True, exists=True)
    assert order == linecommands.PoolCommand("restart", None, help_only=True)
    assert "usage: %%ddp" in capsys.readouterr().out


def test_export_lines():
    parse = linecommands.parse_export_line
    assert parse("job.py -n 4", None, with_cell=True) == ("job.py", "-n 4")
    assert parse("job.py", "-n 2 -- --lr 1", with_cell=False) == ("job.py", "-n 2 -- --lr 1")
    assert parse("job.py --slurm --time 30", "-n 2 -- --lr 1", with_cell=False) == (
        "job.py", "-n 2 --slurm --time 30 -- --lr 1")
    assert parse("job.py -n 8", "-n 2", with_cell=False) == ("job.py", "-n 8")
    for line, last, words in [("", "-n 2", "usage: %ddp_export SCRIPT.py"),
                              ("job.txt", "-n 2", "the script name must end in .py"),
                              ("job.py", None, "no %%ddp cell has run yet")]:
        with pytest.raises(DDPUsageError, match=re.escape(words)):
            parse(line, last, with_cell=False)


# --------------------------------------------------------------- the Python API
@pytest.mark.parametrize("call, words", [
    (lambda: nbddp.run("pass", n=0), "-n must be a whole number of at least 1, got 0"),
    (lambda: nbddp.run("pass", n=2, bogus=1), "unknown option 'bogus'"),
    (lambda: nbddp.run("pass", n=2, timeout=-1), "--timeout must be more than 0 seconds"),
    (lambda: nbddp.run("x = (1,\n", n=2), "cell line 1 has a syntax error"),
    (lambda: nbddp.run("pass", spec=parse_line("-n 2"), n=2), "give spec= or options, not both"),
    (lambda: nbddp.run("pass", spec=nbddp.LaunchSpec(nproc_per_node=2, ranks_shown=(5,))),
     "--ranks 5 outside 0..1"),
    (lambda: nbddp.run(print, n=2, launcher="torchrun"), "--launcher torchrun runs the cell as a script"),
    (lambda: nbddp.run("pass", n=2, launcher="torchrun", push={"x": 1}), "--push/--pull move values"),
    (lambda: nbddp.run("pass", n=2, launcher="torchrun", nnodes=2), "needs a meeting point"),
    (lambda: nbddp.run("pass", n=2, args=(1,)), "args and kwargs are for a callable"),
    (lambda: nbddp.run("pass", slurm=True), "--slurm writes a Slurm job"),
    (lambda: nbddp.Pool(n=2, launcher="slurm"), "a pool runs on the local launcher only, not --launcher slurm"),
    (lambda: nbddp.Pool(parse_line("-n 2"), n=3), "give spec= or options, not both"),
    (lambda: nbddp.Pool(n=3).run("pass"), "no pool is running; start one"),
    (lambda: nbddp.run("pass", pool=nbddp.Pool(n=3)), "no pool is running; start one"),
    (lambda: nbddp.Pool(n=3).run("pass", ranks=[5]), "--ranks 5 outside 0..2"),
])
def test_the_api_raises_a_value_error_before_anything_starts(call, words):
    with pytest.raises(DDPUsageError, match=re.escape(words)) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, __import__("IPython.core.error").core.error.UsageError)


def test_one_table_of_sources():
    from nbddp import api

    assert set(api.SOURCES) == {"local", "pool", "torchrun", "slurm", "ray"}


def test_only_the_magic_raises_ipythons_usage_error():
    package = ROOT / "nbddp"
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if re.search(r"\bimport UsageError\b|\bUsageError\(", re.sub(r"DDPUsageError", "", p.read_text())))
    assert users == ["magic.py"], users


def test_the_cell_syntax_is_checked_in_one_place():
    package = ROOT / "nbddp"
    parsers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if "except SyntaxError" in p.read_text())
    # diagnosis.py reads a cell for collective calls, and says nothing of a syntax error
    assert parsers == ["core/diagnosis.py", "core/launchrules.py"], parsers


def test_private_net_rule_is_applied_by_the_store_host(monkeypatch):
    from nbddp.forkserver import privnet

    monkeypatch.setenv(settings.PRIVATE_NET.name, "1")
    monkeypatch.setattr(privnet, "_probed", {})  # decided once per process: decide again here
    with pytest.raises(DDPUsageError, match="--start-method spawn starts ranks outside the private network"):
        rendezvous.host_for(parse_line("--start-method spawn"))
    with pytest.raises(DDPUsageError, match=r"--master-addr 10\.1\.2\.3 is not this machine's loopback"):
        rendezvous.host_for(parse_line("--master-addr 10.1.2.3"))


# ------------------------------------------- input that passed the rules and then failed raw (#37.16)
RAW_BEFORE = [  # (a call, words its one-line DDPUsageError says)
    (lambda: parse_line("--master-addr " + "a" * 64 + ".example"), "host name or IP address"),
    (lambda: parse_line("--master-addr node\udc80"), "lone surrogate"),
    (lambda: parse_line("--master-addr 'node 0'"), "host name or IP address"),
    (lambda: parse_line("--launcher torchrun --rdzv-endpoint " + "b" * 64 + ":29500"), "host name or IP"),
    (lambda: parse_line("--log-dir /etc/passwd"), "exists and is not a folder"),
    (lambda: parse_line("--log-dir /etc/passwd/logs"), "/etc/passwd is not a folder"),
    (lambda: nbddp.run("pass", n=1, master_port="29500"), "--master-port takes a port number"),
    (lambda: nbddp.run("pass", n=1, master_port=True), "--master-port takes a port number"),
    (lambda: nbddp.run("pass", n=1, timeout="10"), "--timeout takes a number of seconds"),
    (lambda: nbddp.run("pass", n=1, timeout=float("nan")), "--timeout takes a number of seconds"),
    (lambda: nbddp.run("pass", n=1, nnodes="2"), "--nnodes must be a whole number"),
    (lambda: nbddp.run("pass", n=1, ranks_shown=0), "--ranks takes a list"),
    (lambda: nbddp.run("pass", n=1, env={"A": "x\0y"}), "NUL"),
    (lambda: nbddp.run("pass", n=1, pull=["x@y"]), "not a Python name"),
    (lambda: nbddp.run("pass", n=1, fresh="no"), "--fresh takes True or False"),
    (lambda: nbddp.run("pass", n=1, export="x.py", slurm=True, partition="a\nb"), "Slurm name"),
    (lambda: nbddp.run("pass", n=1, push=5), "push= takes a dict"),
    (lambda: nbddp.run("pass", n=1, cwd="/nonexistent/x"), "cwd= takes a folder that exists"),
    (lambda: rules.check_cell("# %%ddp\nreturn 1\n"), "'return' outside function"),
    (lambda: rules.check_cell("# %%ddp\nyield 1\n"), "'yield' outside function"),
    (lambda: rules.check_cell("# %%ddp\nawait f()\n"), "'await' outside function"),
    (lambda: rules.check_cell("x = 1\0"), "null bytes"),
]


@pytest.mark.parametrize("call, words", RAW_BEFORE)
def test_input_that_used_to_fail_raw_is_refused_in_one_line_before_anything_starts(call, words):
    with pytest.raises(DDPUsageError) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_a_log_dir_under_the_home_folder_is_there_not_in_a_folder_named_tilde():
    assert parse_line("--log-dir ~/nbddp-logs").log_dir == str(Path.home() / "nbddp-logs")
    assert nbddp.core.launchrules.make_spec(log_dir="~/x").log_dir == str(Path.home() / "x")
    assert rules.given_or_made(LaunchSpec(log_dir="~/y")).log_dir == str(Path.home() / "y")


def test_hosts_and_endpoints_that_are_fine_still_pass():
    for line in ("--master-addr ::1", "--master-addr [::1]", "--master-addr node-0.cluster_a.local",
                 "--master-addr 10.0.0.1", "--master-addr b\u00fccher.example",
                 "--launcher torchrun --rdzv-endpoint [::1]:29500", "--launcher torchrun --rdzv-endpoint n0:29500",
                 "--launcher torchrun --rdzv-endpoint localhost"):
        assert parse_line(line) is not None, line


# ------------------------------------------------- how many ranks the machine runs (#37.9)
def test_a_rank_count_past_what_the_machine_runs_is_refused_naming_both_numbers():
    from nbddp.core import capacity

    many = 2 * min(capacity.limits(capacity.machine()))[0] + 1  # past the bound even if memory moves
    for line, n in ((f"-n {many}", many), ("-n 99999999999", 99999999999),
                    (f"--nproc-per-node {many} --launcher torchrun", many)):
        with pytest.raises(DDPUsageError, match=rf"^%%ddp: -n {n} ranks is more than") as info:
            parse_line(line)
        assert f"add --max-ranks {n}" in str(info.value), str(info.value)
    with pytest.raises(DDPUsageError, match=r"is more than this machine runs: at most \d+ \(.*\); if you mean it"):
        nbddp.run("pass", n=many)
    assert parse_line(f"-n {many} --max-ranks {many}").world_size == many  # the way past it
    with pytest.raises(DDPUsageError, match=r"-n 3 ranks is more than --max-ranks 2"):
        parse_line("-n 3 --max-ranks 2")
    assert parse_line("-n 32").world_size == 32  # the lessons' largest on a small machine


def test_the_bound_comes_from_each_limit_of_the_machine():
    from nbddp.core.capacity import AT_LEAST, Machine, refusal

    roomy = Machine(cores=2, mem_available_mib=10 ** 6, nproc_limit=None, fd_hard_limit=None)
    assert refusal(AT_LEAST, AT_LEAST, None, roomy) is None
    assert "2 cores" in refusal(AT_LEAST + 1, AT_LEAST + 1, None, roomy)
    assert "GiB of memory" in refusal(40, 40, None, Machine(256, 1024, None, None))         # 32 ranks fit
    assert "ulimit -u" in refusal(40, 40, None, Machine(256, None, 50, None))
    assert "ulimit -Hn" in refusal(300, 300, None, Machine(256, None, None, 1024))
    assert refusal(10 ** 6, 10 ** 6, None, None).startswith("-n 1000000 ranks is more than 65536")  # Slurm
    assert refusal(8, 16, None, Machine(1, 1024, None, None)) is None                     # torchrun: this node's
    assert "8 ranks on this machine (-n 16)" in refusal(8, 16, None, Machine(1, 128, None, None))


def test_a_pool_started_past_the_bound_runs_its_cells():
    from nbddp.core import capacity

    many = min(capacity.limits(capacity.machine()))[0] + 1
    pool = linecommands.parse_pool_line(f"start -n {many} --max-ranks {many}", running=False, exists=False).spec
    assert rules.choose_source(parse_line("--timeout 5", shape=pool), pool=pool) == "pool"
    assert rules.given_or_made(None, None, {"timeout": 5}, shape=pool).world_size == many


def test_an_exported_script_under_the_home_folder_is_there_not_in_a_folder_named_tilde():
    assert parse_line("--export ~/job.py").export == str(Path.home() / "job.py")
    assert linecommands.parse_export_line("~/job.py -n 2", None, with_cell=True)[0] == str(Path.home() / "job.py")


def test_the_cell_check_shows_no_warning_of_its_own(recwarn):
    """Compiling the cell to check it (a top-level return) must not show its SyntaxWarnings a
    second time in the notebook: each rank shows them, as Python would."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under pytest -W error: a warning would be raised
        rules.check_cell("# %%ddp\nx = 1\nif x is 1:\n    pass\ny = '\\d'\n")
    assert not [w for w in recwarn if issubclass(w.category, (SyntaxWarning, DeprecationWarning))]
