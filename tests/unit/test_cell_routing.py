"""With ``--all-cells`` a cell of code goes to the pool, one that begins with a magic, ``!`` or
``?`` stays in the kernel, ``%%local`` runs its body in the kernel with the notebook's line
numbers; ``%ddp_pool``'s own option and command are checked before anything runs."""
import pytest

from nbddp import DDPUsageError
from nbddp.core.cellrouting import KERNEL, LOCAL, NOTHING, POOL, route, without_local
from nbddp.core.linecommands import parse_pool_line


def lines(text):
    return text.splitlines(keepends=True)


@pytest.mark.parametrize("cell, where", [
    ("x = 1\n", POOL),
    ("# a note first\nx = 1\n", POOL),
    ("\n   \nprint(rank)", POOL),
    ("%ddp_pool status\n", KERNEL),
    ("%%ddp --ranks 0\nprint(1)", KERNEL),  # an explicit %%ddp runs as written (on the pool)
    ("%matplotlib inline\nimport x", KERNEL),
    ("!pip list\n", KERNEL),
    ("?print\n", KERNEL),
    ("print?\n", KERNEL),
    ("%%local\nimport os", LOCAL),
    ("\n%%local  \nimport os", LOCAL),
    ("%%localhost\nx", KERNEL),  # another magic, not %%local
    ("", NOTHING),
    ("\n  \n", NOTHING),
])
def test_where_a_cell_runs(cell, where):
    assert route(lines(cell)) == where


def test_a_local_cell_keeps_its_line_numbers():
    body = without_local(lines("\n%%local\nx = 1\nraise ValueError\n"))
    assert body == ["\n", "\n", "x = 1\n", "raise ValueError\n"]
    assert "".join(body).splitlines()[3] == "raise ValueError"  # line 4, as the notebook shows it


def test_all_cells_goes_with_start_and_not_into_the_launch_options():
    order = parse_pool_line("start -n 2 --all-cells --timeout 30", running=False, exists=False)
    assert order.all_cells is True and order.spec.world_size == 2 and order.spec.timeout == 30
    assert parse_pool_line("start -n 2", running=False, exists=False).all_cells is None
    # after --, it is the script's own argument
    order = parse_pool_line("start -n 2 -- --all-cells", running=False, exists=False)
    assert order.all_cells is None and order.spec.script_args == ("--all-cells",)


@pytest.mark.parametrize("line, says", [
    ("all-cells", "usage: %ddp_pool all-cells on|off"),
    ("all-cells maybe", "usage: %ddp_pool all-cells on|off, got 'maybe'"),
    ("all-cells on off", "usage: %ddp_pool all-cells on|off"),
    ("restart --all-cells", "--all-cells goes with start"),
    ("stop --all-cells", "--all-cells goes with start"),
])
def test_bad_all_cells_lines_are_one_line(line, says):
    with pytest.raises(DDPUsageError, match=None) as raised:
        parse_pool_line(line, running=True, exists=True)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_all_cells_on_needs_a_running_pool():
    with pytest.raises(DDPUsageError, match="no pool is running to take every cell"):
        parse_pool_line("all-cells on", running=False, exists=True)
    assert parse_pool_line("all-cells off", running=False, exists=False).all_cells is False
    assert parse_pool_line("all-cells on", running=True, exists=True).all_cells is True

