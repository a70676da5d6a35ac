"""Nothing lost on the way to the browser: a real jupyter_server with its default iopub limits
(1 MB/s of stream data, 1,000 messages/s, over 3 s), a kernel it started, and its websocket, as
JupyterLab talks to it. A flood of 4 ranks × 50,000 lines in text mode: the server never says
"IOPub data rate exceeded", the held-back lines are said (rank, stream, line numbers) and, with
the lines shown, account for every line; the end-of-cell note, the transcript and the error arrive."""
from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.request
import uuid

import pytest

from support.frontend import visible_lines
from support.helpers import jupyter_server

FLOOD = """%%ddp -n 4 --output text --same-lines apart --idle-warning 0
import os
rank = int(os.environ["RANK"])
print("\\n".join(f"step {i}" for i in range(50_000)), flush=True)
if rank == 1:
    raise ValueError("rank one gave up")
"""


@pytest.fixture
def server(tmp_path):
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    env.pop("NBDDP_OUTPUT", None)
    with jupyter_server("jupyter_server", tmp_path, env, tmp_path / "server.log") as (base, token):
        yield base.removeprefix("http://"), token


def _api(base, token, path, method="GET", body=None):
    req = urllib.request.Request(f"http://{base}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        data = r.read()
    return json.loads(data) if data else None


async def _run_cells(base, token, kernel_id, cells, timeout=240):
    """Execute each cell through the server's kernel websocket; return each cell's messages."""
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(f"ws://{base}/api/kernels/{kernel_id}/channels?token={token}")
    session = uuid.uuid4().hex
    replies = []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                           "version": "5.3", "date": ""},
                # as JupyterLab sends it: a front end behind the server, whose output nbddp paces
                "parent_header": {}, "metadata": {"deletedCells": [], "recordTiming": False, "cellId": msg_id},
                "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            got, deadline = [], time.monotonic() + timeout
            while True:
                raw = await asyncio.wait_for(ws.read_message(), max(1.0, deadline - time.monotonic()))
                assert raw is not None, "the websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id or msg.get("channel") != "iopub":
                    continue
                got.append(msg)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
            replies.append(got)
    finally:
        ws.close()
    return replies


def test_a_flood_through_a_real_server_loses_nothing_unsaid_and_the_report_arrives(server, tmp_path):
    base, token = server
    kernel = _api(base, token, "/api/kernels", "POST", {"name": "python3", "path": ""})
    try:
        _, flood = asyncio.run(_run_cells(base, token, kernel["id"], ["%load_ext nbddp", FLOOD]))
    finally:
        _api(base, token, f"/api/kernels/{kernel['id']}", "DELETE")
    streams = [(m["content"]["name"], m["content"]["text"]) for m in flood if m["msg_type"] == "stream"]
    text = "".join(t for _, t in streams)
    assert "IOPub data rate exceeded" not in text and "IOPub message rate exceeded" not in text
    shown = {r: set() for r in range(4)}
    for line in visible_lines(streams):   # as JupyterLab renders them (a line shown in place, then written)
        m = re.fullmatch(r"\[rank(\d)\]:step (\d+)", line)
        if m:
            shown[int(m[1])].add(int(m[2]) + 1)
    notes = [t for n, t in streams if n == "stderr" and "not shown here" in t]
    held = {r: set() for r in range(4)}
    for note in notes:
        for m in re.finditer(r"rank (\d) stdout lines? ([\d,]+)(?:–([\d,]+))?", note):
            a, b = int(m[2].replace(",", "")), int((m[3] or m[2]).replace(",", ""))
            held[int(m[1])] |= set(range(a, b + 1))
    for r in range(4):   # every line either reached the browser or was said held back, once
        assert shown[r] | held[r] == set(range(1, 50_001)) and not shown[r] & held[r], r
    total = sum(len(h) for h in held.values())
    assert total and re.search(r"[\d,]+ lines not shown here \(rank 0: ", text), text[-3000:]
    kinds = [m["msg_type"] for m in flood]
    transcript = [m for m in flood if m["msg_type"] == "display_data"
                  and m["content"].get("metadata", {}).get("nbddp", {}).get("transcript")]
    assert transcript, kinds[-20:]
    errors = [m for m in flood if m["msg_type"] == "error"]
    assert errors and errors[0]["content"]["ename"] == "DDPError", kinds[-20:]
    assert "rank 1" in "\n".join(errors[0]["content"]["traceback"])
