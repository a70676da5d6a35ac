"""The display of a launch in a real kernel: the live widget view (comm messages), the static
transcript the output carries, --output auto/widgets/text, --ranks, rich output from ranks,
a flood, 32 ranks, and _ddp."""
import json
import queue
import time

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# what JupyterLab puts in every execute_request's metadata
LAB_METADATA = {"deletedCells": [], "recordTiming": False, "cellId": "c1"}


def run_raw(kernel, code, metadata=None, timeout=240):
    """Execute and return every iopub message of the cell (comm messages included) and the reply."""
    kc = kernel.kc
    content = dict(code=code, silent=False, store_history=True, user_expressions={},
                   allow_stdin=False, stop_on_error=True)
    msg = kc.session.msg("execute_request", content, metadata=metadata or {})
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    messages, start = [], time.monotonic()
    while True:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"cell did not finish in {timeout} s")
        try:
            m = kc.get_iopub_msg(timeout=1.0)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
        messages.append(m)
    while True:   # skip stale replies (a kernel_info reply from wait_for_ready, say)
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return messages, reply["content"]


def of_type(messages, *kinds):
    return [m for m in messages if m["msg_type"] in kinds]


def stdout_of(messages):
    return "".join(m["content"]["text"] for m in of_type(messages, "stream") if m["content"]["name"] == "stdout")


def final_bundle(messages):
    """The data of the last display/update of the view (what the saved notebook keeps)."""
    shown = of_type(messages, "display_data", "update_display_data")
    assert shown, [m["msg_type"] for m in messages]
    return shown[-1]["content"]["data"]


def status_htmls(messages):
    """Each HTML the live status display (headline, banner, chips) showed, in order."""
    return [m["content"]["data"]["text/html"] for m in of_type(messages, "display_data", "update_display_data")
            if 'class="nbddp-status"' in m["content"]["data"].get("text/html", "")]


def widget_display(messages):
    """The display_data that showed the live widget view."""
    return [m for m in of_type(messages, "display_data") if WIDGET_MIME in m["content"]["data"]][0]


def widget_msgs(messages):
    """What went to the widget front end: new widgets (a pane's blocks) and state updates."""
    return of_type(messages, "comm_open", "comm_msg")


def comm_models(messages):
    """model_id -> model_name of every widget the cell created."""
    return {m["content"]["comm_id"]: m["content"]["data"]["state"].get("_model_name")
            for m in of_type(messages, "comm_open")}


TWO_RANKS = """%%ddp -n 2 {opts}
import sys, os
print("hello from", os.environ["RANK"])
print("warn", os.environ["RANK"], file=sys.stderr)
"""


def test_widgets_view_and_transcript(kernel):
    messages, reply = run_raw(kernel, TWO_RANKS.format(opts="--output widgets"))
    assert reply["status"] == "ok", reply
    first = widget_display(messages)
    status = of_type(messages, "display_data")[0]
    assert status is not first and "rank 0: " in status["content"]["data"]["text/plain"]
    update = of_type(messages, "update_display_data")[-1]
    # the durable output: the transcript in the status display, the widget's display emptied
    assert update["content"]["transient"]["display_id"] == status["content"]["transient"]["display_id"]
    emptied = [m["content"]["data"] for m in of_type(messages, "update_display_data")
               if m["content"]["transient"]["display_id"] == first["content"]["transient"]["display_id"]]
    assert emptied == [{"text/html": "", "text/plain": ""}]
    data = update["content"]["data"]
    root = first["content"]["data"][WIDGET_MIME]["model_id"]
    assert WIDGET_MIME not in data   # the durable output is the transcript alone
    models = comm_models(messages)
    assert models[root] == "VBoxModel" and "TabModel" in models.values() and "DropdownModel" not in models.values()
    # the tab titles name each rank and the interleaved view
    tab = [m for m in of_type(messages, "comm_open")
           if m["content"]["data"]["state"].get("_model_name") == "TabModel"][0]
    titles = tab["content"]["data"]["state"].get("titles")
    updates = [m["content"]["data"]["state"] for m in of_type(messages, "comm_msg")
               if m["content"]["comm_id"] == tab["content"]["comm_id"]
               and "titles" in m["content"]["data"].get("state", {})]
    if updates:
        titles = updates[-1]["titles"]
    assert list(titles) == ["rank 0", "rank 1", "all ranks"]
    # live pane contents went out as widget state updates: stderr highlighted, all-ranks prefixed
    values = " ".join(str(m["content"]["data"].get("state", {}).get("value", "")) for m in widget_msgs(messages))
    assert "hello from 0" in values and "hello from 1" in values
    assert 'class="nbddp-stderr"' in values and "[rank1]: hello from 1" in values
    chips = " ".join(status_htmls(messages))
    assert "rank 0: ok" in chips and "rank 1: ok" in chips and "exit 0" in chips
    # the static transcript in the same output
    assert "--- rank 0 (2 lines) ---\nhello from 0\nstderr| warn 0" in data["text/plain"]
    assert "hello from 1" in data["text/html"] and "nbddp-chip nbddp-ok" in data["text/html"]
    assert "[rank0]:" not in stdout_of(messages)   # widgets mode does not also print text


def test_auto_is_text_for_plain_clients_and_widgets_for_jupyterlab(kernel):
    messages, _ = run_raw(kernel, TWO_RANKS.format(opts=""))
    out = stdout_of(messages)
    assert "[rank0]:hello from 0\n" in out and "[rank1]:hello from 1\n" in out
    assert not of_type(messages, "comm_open")
    data = final_bundle(messages)
    assert WIDGET_MIME not in data and "rank 1: ok" in data["text/html"] and "rank 1: ok" in data["text/plain"]
    assert "hello from 1" not in data["text/html"] + data["text/plain"]  # streamed above: each line once
    messages, _ = run_raw(kernel, TWO_RANKS.format(opts=""), metadata=LAB_METADATA)
    assert widget_display(messages)
    assert "[rank0]:" not in stdout_of(messages)
    messages, _ = run_raw(kernel, TWO_RANKS.format(opts="--output text"), metadata=LAB_METADATA)
    assert "[rank0]:hello from 0\n" in stdout_of(messages) and not of_type(messages, "comm_open")


def test_ranks_filter_shows_only_chosen_ranks_but_all_run(kernel):
    # the printed word is one no header, port or temporary folder name can contain
    cell = "%%ddp -n 3 --ranks 0,2 {}\nimport os; print('said-by-' + os.environ['RANK'])\n"
    messages, _ = run_raw(kernel, cell.format("--output text"))
    out = stdout_of(messages)
    assert "[rank0]:said-by-0" in out and "[rank2]:said-by-2" in out and "said-by-1" not in out, out
    messages, _ = run_raw(kernel, cell.format("--output widgets"))
    data = final_bundle(messages)
    assert "--- rank 0" in data["text/plain"] and "--- rank 2" in data["text/plain"]
    assert "--- rank 1" not in data["text/plain"] and "rank 1: ok" in data["text/plain"]
    assert "said-by-1" not in data["text/plain"]
    reply = kernel.ok("print([r.state for r in _ddp.ranks], _ddp.ranks[1].stdout.strip())")
    assert reply.stdout.strip() == "['ok', 'ok', 'ok'] said-by-1"


RICH = """%%ddp -n 2 --output {mode}
import os
import IPython.display
from IPython.display import HTML
import matplotlib.pyplot as plt
import pandas as pd
rank = int(os.environ["RANK"])
display(pd.DataFrame({{"rank": [rank], "sq": [rank * rank]}}))
IPython.display.display(HTML(f"<b>bold {{rank}}</b>"))
plt.plot([0, rank + 1]); plt.title(f"plot {{rank}}"); plt.show()
"""


def test_rich_output_from_ranks_text_mode(kernel):
    messages, reply = run_raw(kernel, RICH.format(mode="text"))
    assert reply["status"] == "ok", stdout_of(messages)
    shown = [m["content"] for m in of_type(messages, "display_data")]
    per_rank = {}
    for c in shown:
        rank = c["metadata"].get("nbddp", {}).get("rank")
        if rank is not None:
            per_rank.setdefault(rank, []).append(c["data"])
    for r in (0, 1):
        kinds = per_rank[r]
        assert any("<table" in d.get("text/html", "") and "sq" in d["text/html"] for d in kinds)
        assert any(d.get("text/html") == f"<b>bold {r}</b>" for d in kinds)
        pngs = [d["image/png"] for d in kinds if "image/png" in d]
        assert len(pngs) == 1 and pngs[0].startswith("iVBORw0KGgo")  # a real PNG, base64


def test_rich_output_lands_in_the_ranks_pane(kernel):
    messages, reply = run_raw(kernel, RICH.format(mode="widgets"))
    assert reply["status"] == "ok"
    outputs_states = [m["content"]["data"]["state"]["outputs"] for m in of_type(messages, "comm_msg")
                      if "outputs" in m["content"]["data"].get("state", {})]
    last_by_comm = {}
    for m in of_type(messages, "comm_msg"):
        state = m["content"]["data"].get("state", {})
        if "outputs" in state:
            last_by_comm[m["content"]["comm_id"]] = state["outputs"]
    # each display is an Output block of its own in the rank's pane, in order with its lines
    assert outputs_states and len(last_by_comm) == 6 and all(len(o) == 1 for o in last_by_comm.values())
    assert sum("image/png" in o[0]["data"] for o in last_by_comm.values()) == 2
    data = final_bundle(messages)
    assert data["text/html"].count("data:image/png;base64,") == 2 and "bold 1" in data["text/html"]


def test_flood_stays_bounded_and_the_kernel_responsive(kernel):
    cell = """%%ddp -n 2 --output widgets
import os, sys
if os.environ["RANK"] == "0":
    for i in range(200_000):
        print("flood line", i)
else:
    line = "y" * 999 + "\\n"
    for _ in range(50_000):          # 50 MB
        sys.stdout.write(line)
    sys.stdout.flush()
"""
    t = time.monotonic()
    messages, reply = run_raw(kernel, cell)
    elapsed = time.monotonic() - t
    assert reply["status"] == "ok"
    comm_bytes = sum(len(json.dumps(m["content"])) for m in widget_msgs(messages))
    n_comm = len(widget_msgs(messages))
    print(f"flood: {elapsed:.1f} s, {n_comm} widget updates, {comm_bytes / 1e6:.1f} MB to the front end")
    assert elapsed < 120
    # the front end got a bounded tail, not 60 MB: updates are batched and each is a bounded tail
    assert comm_bytes < 0.2 * 60e6 and n_comm < 20 * (elapsed + 2) * 4
    data = final_bundle(messages)
    assert "flood line 199999" in data["text/plain"]
    assert "199800 earlier lines hidden" in data["text/plain"] and "49800 earlier lines hidden" in data["text/plain"]
    values = [m["content"]["data"]["state"]["value"] for m in widget_msgs(messages)
              if "earlier" in str(m["content"]["data"].get("state", {}).get("value", ""))]
    assert any("earlier lines hidden; full log:" in v and "rank0.stdout" in v for v in values)
    assert len(json.dumps(data)) < 3e6
    # full logs on disk, and the kernel answers at once
    t = time.monotonic()
    r = kernel.ok("print(_ddp.ranks[0].stdout.count('\\n'), len(_ddp.ranks[1].stdout))")
    assert r.stdout.split() == ["200000", "50000000"] and time.monotonic() - t < 10


def test_32_ranks_use_a_selector(kernel):
    cell = "%%ddp -n 32 --output widgets\nimport os; print('rank says', os.environ['RANK'])\n"
    messages, reply = run_raw(kernel, cell, timeout=300)
    assert reply["status"] == "ok", (reply, [m["content"] for m in of_type(messages, "stream", "error")])
    models = comm_models(messages)
    assert "DropdownModel" in models.values() and "StackModel" in models.values()
    assert "TabModel" not in models.values()
    drop = [m for m in of_type(messages, "comm_open")
            if m["content"]["data"]["state"].get("_model_name") == "DropdownModel"][0]
    labels = drop["content"]["data"]["state"]["_options_labels"]
    assert len(labels) == 33 and labels[0] == "rank 0" and labels[31] == "rank 31" and labels[32] == "all ranks"
    data = final_bundle(messages)
    for r in range(32):
        assert f"rank {r}: ok" in data["text/plain"] and f"rank says {r}\n" in data["text/plain"]
    assert data["text/html"].count("nbddp-chip nbddp-ok") == 32


def test_failure_chip_and_ddp_result(kernel):
    cell = """%%ddp -n 2 --output widgets
import os, sys
if os.environ["RANK"] == "1":
    raise ValueError("rank one broke")
import time; time.sleep(30)
"""
    messages, reply = run_raw(kernel, cell)
    assert reply["status"] == "error" and reply["ename"] == "DDPError"
    data = final_bundle(messages)
    assert "rank 1: failed" in data["text/plain"] and "rank 0: terminated" in data["text/plain"]
    assert "nbddp-chip nbddp-failed" in data["text/html"] and "ValueError: rank one broke" in data["text/html"]
    r = kernel.ok("print(_ddp.ranks[1].state, _ddp.ranks[1].exitcode, 'rank one broke' in _ddp.ranks[1].stderr)")
    assert r.stdout.split() == ["failed", "1", "True"]


# torch.cuda's memory API as a GPU rank's would answer (this CPU build has none; tests/kernel/
# test_gpu.py reads the real one on a GPU): what nbddp's rank reads at a cell's end, nothing else.
CUDA_READINGS = """import os, torch
r = int(os.environ["LOCAL_RANK"])
stats = {"allocated_bytes.all.peak": (64 + r) << 20, "allocated_bytes.all.current": 4 << 20,
         "reserved_bytes.all.current": 80 << 20}
torch.cuda.is_initialized = lambda: True
torch.cuda.device_count = lambda: 2
torch.cuda.memory_stats = lambda i: stats if i == 0 else {}
"""


def test_a_ranks_cuda_memory_reaches_the_report_and_ddp_from_its_own_ranks_and_torchruns(kernel):
    def report(reply):  # the transcript a text-mode cell shows once its ranks have ended
        return "".join(o.get("data", {}).get("text/plain", "") for o in reply.outputs)

    text = report(kernel.ok("%%ddp -n 2 --output text\n" + CUDA_READINGS))
    lines = text.splitlines()
    assert "  rank 0: cuda:0 peak 64 MiB, 4 MiB held at the end" in lines, text
    assert "  rank 1: cuda:0 peak 65 MiB, 4 MiB held at the end" in lines
    assert any(x.startswith("note: ranks 0–1 all allocated on GPU 0") for x in lines)  # two GPUs, one used
    got = kernel.ok("print(_ddp.ranks[1].gpu_memory)").stdout
    assert "'peak': 68157440" in got and "'device': 0" in got and "'count': 2" in got, got
    text = report(kernel.ok("%%ddp -n 1 --launcher torchrun --output text --env CUDA_VISIBLE_DEVICES=3,5\n"
                            + CUDA_READINGS))
    assert "rank 0: cuda:0 (GPU 3) peak 64 MiB, 4 MiB held at the end" in text, text
    assert "GPU memory" not in report(kernel.ok("%%ddp -n 1 --output text\nimport torch"))


def test_steady_flood_of_long_lines_is_rate_limited(kernel):
    """Long lines make every pane ~1 MB of HTML: updates must stay within a byte rate, not only
    a message rate (before the token bucket this sent ~5 MB/s for two ranks)."""
    cell = """%%ddp -n 2 --output widgets
import sys, time
line = "z" * 1500 + "\\n"
end = time.time() + 6
while time.time() < end:
    sys.stdout.write(line * 200); sys.stdout.flush(); time.sleep(0.01)
"""
    t = time.monotonic()
    messages, reply = run_raw(kernel, cell)
    elapsed = time.monotonic() - t
    assert reply["status"] == "ok"
    sent = sum(len(json.dumps(m["content"])) for m in widget_msgs(messages))
    print(f"steady long-line flood: {elapsed:.1f} s, {sent / 1e6:.1f} MB to the front end")
    assert sent / elapsed < 2.5e6, (sent, elapsed)
    # still live: several updates of rank 0's pane went out while it ran
    values = [m for m in widget_msgs(messages) if "zzzz" in str(m["content"]["data"].get("state", {}).get("value", ""))]
    assert len(values) >= 4


def test_hang_shows_a_banner_and_amber_chips_until_output_resumes(kernel):
    cell = """%%ddp -n 2 --output widgets --idle-warning 1.5
import os, time
if os.environ["RANK"] == "0":
    time.sleep(4.5)        # silent, as a rank waiting in a collective is
else:
    time.sleep(3.5)
    print("rank 1 is back", flush=True)
time.sleep(1.5)
"""
    messages, reply = run_raw(kernel, cell)
    assert reply["status"] == "ok", reply
    headers = status_htmls(messages)
    hung = [i for i, h in enumerate(headers) if 'class="nbddp-hang"' in h]
    assert hung, headers[-1]
    banner = headers[hung[0]]
    assert "rank 0 blocked at " in banner and "rank 1 blocked at " in banner, banner
    assert banner.count("nbddp-chip nbddp-hung") == 2
    # rank 1 wrote again: the banner went and the chips are back to their state
    assert hung[-1] < len(headers) - 1 and 'class="nbddp-hang"' not in headers[-1]
    assert "nbddp-hung" not in headers[-1]


FAILING = ("import os\nif os.environ['RANK'] == '1':\n    raise ValueError('bad batch')\n"
           "print('fine', os.environ['RANK'])")
TB = "Traceback (most recent call last)"  # the header of IPython's traceback, as of Python's


def test_a_failed_ranks_traceback_is_shown_once_in_each_form(kernel):
    # text mode (papermill, a plain client): once, in the streamed lines; not in the transcript
    # (the status alone: each line once in a saved notebook) nor in the error, which points at it
    messages, reply = run_raw(kernel, "%%ddp -n 2 --output text\n" + FAILING)
    assert reply["status"] == "error" and reply["ename"] == "DDPError", reply
    streams = "".join(m["content"]["text"] for m in of_type(messages, "stream"))
    transcript_text = final_bundle(messages)["text/plain"]
    error = "\n".join(reply["traceback"])
    assert streams.count(TB) == 1 and transcript_text.count(TB) == 0 and error.count(TB) == 0, \
        (streams, transcript_text, error)
    assert "ValueError: bad batch at cell line 4" in error and "rank 1's traceback is in its output above" in error
    assert streams.count("fine 0") == 1 and "fine 0" not in transcript_text  # each line once
    assert "rank 0: ok" in transcript_text and "rank 1: failed" in transcript_text, transcript_text
    assert final_bundle(messages)["text/html"].count(TB) == 0 and "fine 0" not in final_bundle(messages)["text/html"]
    # widgets (JupyterLab): the live view becomes the transcript, which holds it once per form
    messages, reply = run_raw(kernel, "%%ddp -n 2 --output widgets\n" + FAILING)
    final = final_bundle(messages)
    error = "\n".join(reply["traceback"])
    assert final["text/plain"].count(TB) == 1 and final["text/html"].count(TB) == 1, final
    assert error.count(TB) == 0 and not of_type(messages, "stream"), error
    # a rank no view showed (--ranks 0 while rank 1 fails): the error carries its traceback
    messages, reply = run_raw(kernel, "%%ddp -n 2 --ranks 0 --output text\n" + FAILING)
    error = "\n".join(reply["traceback"])
    assert error.count(TB) == 1 and "--- rank 1 traceback ---" in error and "ValueError: bad batch" in error, error
    streams = "".join(m["content"]["text"] for m in of_type(messages, "stream"))
    assert TB not in streams, streams
