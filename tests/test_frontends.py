"""--output auto in a real kernel, with this test acting as the front ends over the real protocol:
several clients on one kernel, each its own session, each sending what its front end sends
(JupyterLab's and VS Code's execute_request metadata, JupyterLab's comm_close for a comm target
it has no handler for, a widget manager's control comm)."""
import pytest
from jupyter_client.session import Session

from kernel import Kernel
from test_display import WIDGET_MIME, of_type, run_raw, stdout_of

pytestmark = pytest.mark.kernel

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
    return [m["content"]["comm_id"] for m in of_type(messages, "comm_open")
            if m["content"].get("target_name") == "jupyter.widget"]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("nb")))
    yield k
    k.shutdown()


def test_auto_follows_what_each_front_end_can_render(kernel):
    lab_without_widgets = Client(kernel)
    messages, reply = run_raw(lab_without_widgets, "%load_ext nbddp", metadata=LAB)
    assert reply["status"] == "ok"
    probe = probes(messages)
    assert len(probe) == 1, messages  # one small widget, for the round trip
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
    messages, _ = run_raw(lab_without_widgets, CELL.format(""), metadata=LAB)
    assert widgets_shown(messages)
    for client in (lab_without_widgets, lab):
        client.kc.stop_channels()
