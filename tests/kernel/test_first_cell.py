"""The first cell after %load_ext nbddp waits for torch to be imported (seconds): it says so at
once, and the status goes when the wait ends (benchmarks/first_cell.py times it)."""
import datetime

from test_display import of_type, run_raw, stdout_of

from support.kernel import Kernel


def _when(msg) -> datetime.datetime:
    date = msg["header"]["date"]
    return date if isinstance(date, datetime.datetime) else datetime.datetime.fromisoformat(date)


def test_first_cell_says_it_is_importing_torch_at_once_then_clears_it(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        k.ok("%load_ext nbddp")  # torch is now being imported in the background
        messages, reply = run_raw(k, "%%ddp -n 2 --output text\nprint('first line')")
        assert reply["status"] == "ok"
        shown = of_type(messages, "stream", "display_data")
        status = shown[0]
        assert status["msg_type"] == "display_data", shown[:3]
        assert status["content"]["data"]["text/plain"] == "nbddp: starting ranks: importing torch, first cell only"
        started = _when(of_type(messages, "execute_input")[0])
        # kernel-side clock: the status leaves the kernel right as the cell starts (0.3 s is the
        # benchmark's figure on an idle machine; this bound allows for a loaded one)
        assert (_when(status) - started).total_seconds() < 1.5
        display_id = status["content"]["transient"]["display_id"]
        cleared = [m for m in of_type(messages, "update_display_data")
                   if m["content"]["transient"]["display_id"] == display_id]
        assert cleared and cleared[-1]["content"]["data"]["text/plain"] == ""
        assert messages.index(cleared[-1]) < messages.index(
            next(m for m in of_type(messages, "stream") if "first line" in m["content"]["text"]))
        assert "[rank1]:first line" in stdout_of(messages)
        # later cells do not wait and show no status
        messages, _ = run_raw(k, "%%ddp -n 2 --output text\nprint('second')")
        assert not of_type(messages, "display_data") or all(
            "importing torch" not in m["content"]["data"].get("text/plain", "")
            for m in of_type(messages, "display_data"))
    finally:
        k.shutdown()
