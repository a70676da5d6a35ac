"""--output auto in a real kernel, with this test acting as the front ends over the real protocol:
several clients on one kernel, each its own session, each sending what its front end sends
(JupyterLab's and VS Code's execute_request metadata, JupyterLab's comm_close for a comm target
it has no handler for, a widget manager's control comm)."""
import time

import pytest
from jupyter_client.session import Session
from test_display import WIDGET_MIME, of_type, run_raw, stdout_of

from nbddp.core.frontends import ANSWER_WINDOW_S
from support.kernel import Kernel

LAB = {"deletedCells": [], "recordTiming": False, "cellId": "c1"}
VSCODE = {"cellId": "vscode-notebook-cell:/home/u/nb.ipynb#W1sZmlsZQ%3D%3D"}
CELL = "%%ddp -n 2 {}\nimport os\nprint('hi from', os.environ['RANK'])\n"
NO_MANAGER = "this front end cannot render ipywidgets"


class Client:
    """Another front end on the same kernel: a client with a session of its own."""

    def __init__(self, kernel):
        signed = kernel.km.session
        self.kc = kernel.km.client(session=Session(key=signed.key, signature_scheme=signed.signature_scheme))
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def send(self, msg_type, content, metadata=None):
        self.kc.shell_channel.send(self.kc.session.msg(msg_type, content, metadata=metadata or {}))


def widgets_shown(messages):
    return any(WIDGET_MIME in m["content"]["data"] for m in of_type(messages, "display_data"))


def probes(messages):
    """The bare widget of nbddp's probe (the one a front end without a manager closes)."""
    return [m["content"]["comm_id"] for m in of_type(messages, "comm_open")
            if m["content"].get("target_name") == "jupyter.widget"
            and m["content"]["data"]["state"].get("_model_name") == "WidgetModel"]


def draw(client, messages):
    """What an ipywidgets 8 manager does with the probe's jslink: set the target to the
    source's value and send it back."""
    links = [m["content"]["data"]["state"] for m in of_type(messages, "comm_open")
             if m["content"]["data"]["state"].get("_model_name") == "LinkModel"]
    assert len(links) == 1, links
    target = links[0]["target"][0].removeprefix("IPY_MODEL_")
    client.send("comm_msg", {"comm_id": target, "data": {"method": "update", "state": {"value": "nbddp-probe"},
                                                          "buffer_paths": []}})


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")))
    yield k
    k.shutdown()


def test_auto_follows_what_each_front_end_can_render(kernel):
    lab_without_widgets = Client(kernel)
    loaded, reply = run_raw(lab_without_widgets, "%load_ext nbddp", metadata=LAB)
    assert reply["status"] == "ok"
    probe = probes(loaded)
    assert len(probe) == 1, loaded  # one small widget, for the round trip
    # JupyterLab without jupyterlab_widgets closes a comm whose target it does not know
    lab_without_widgets.send("comm_close", {"comm_id": probe[0], "data": {}})

    messages, reply = run_raw(lab_without_widgets, CELL.format(""), metadata=LAB)
    out = stdout_of(messages)
    assert reply["status"] == "ok" and not widgets_shown(messages)
    assert "[rank0]:hi from 0" in out and NO_MANAGER in out and "jupyterlab_widgets" in out
    messages, _ = run_raw(lab_without_widgets, CELL.format(""), metadata=LAB)
    assert NO_MANAGER not in stdout_of(messages)  # said once
    messages, _ = run_raw(lab_without_widgets, CELL.format("--output widgets"), metadata=LAB)
    out = stdout_of(messages)
    assert "--output widgets cannot show here" in out and "[rank1]:hi from 1" in out
    assert not widgets_shown(messages)

    # another tab of JupyterLab, with the widgets front end: its own session, so widgets
    lab = Client(kernel)
    messages, _ = run_raw(lab, CELL.format(""), metadata=LAB)
    assert widgets_shown(messages) and probes(messages)  # and its round trip for later cells
    messages, _ = run_raw(lab, CELL.format(""), metadata=LAB)
    assert widgets_shown(messages)

    # VS Code renders ipywidgets 8 and never opens the control comm
    messages, _ = run_raw(Client(kernel), CELL.format(""), metadata=VSCODE)
    assert widgets_shown(messages)

    # nbclient / papermill: text, no line, and no probe whose model the saved notebook would keep
    messages, _ = run_raw(Client(kernel), CELL.format(""), metadata={"cellId": "c9"})
    assert not widgets_shown(messages) and not of_type(messages, "comm_open")
    assert "[rank0]:hi from 0" in stdout_of(messages) and "nbddp: text view" not in stdout_of(messages)

    # the tab without widgets gets them once its manager opens ipywidgets' control comm
    lab_without_widgets.send("comm_open", {"comm_id": "control-1", "target_name": "jupyter.widget.control",
                                           "data": {}}, metadata={"version": "1.0.0"})
    draw(lab_without_widgets, loaded)  # and, being ipywidgets 8's, draws the probe's link
    messages, _ = run_raw(lab_without_widgets, CELL.format(""), metadata=LAB)
    assert widgets_shown(messages)
    for client in (lab_without_widgets, lab):
        client.kc.stop_channels()


def test_a_manager_that_cannot_draw_ipywidgets_8_gets_text_once_it_had_time_to(kernel):
    """An ipywidgets 7 manager (JupyterLab 3 with jupyterlab_widgets 1) cannot build 8's models, so
    it never answers the probe's jslink: its cells sent before it could have answered (a Run All)
    get widgets, a cell sent later gets text saying why. A manager that draws the link keeps
    widgets however late its cells come."""
    old, new = Client(kernel), Client(kernel)
    # loaded already: only the probe goes out. Neither opens the control comm (a fresh kernel had
    # no ipywidgets when the page connected), so JupyterLab's metadata is what says a manager is there
    _, reply = run_raw(old, "%load_ext nbddp", metadata=LAB)
    assert reply["status"] == "ok"
    messages, _ = run_raw(old, CELL.format(""), metadata=LAB)  # sent at once, as Run All would
    assert widgets_shown(messages)
    probed, _ = run_raw(new, CELL.format(""), metadata=LAB)  # its first cell: its own probe
    assert widgets_shown(probed)
    draw(new, probed)
    time.sleep(ANSWER_WINDOW_S + 0.5)
    messages, _ = run_raw(old, CELL.format(""), metadata=LAB)
    out = stdout_of(messages)
    assert not widgets_shown(messages) and "[rank1]:hi from 1" in out, out
    assert "did not draw ipywidgets 8's widgets" in out and "jupyterlab_widgets>=3" in out, out
    messages, _ = run_raw(new, CELL.format(""), metadata=LAB)
    assert widgets_shown(messages) and "did not draw" not in stdout_of(messages)
    for client in (old, new):
        client.kc.stop_channels()
