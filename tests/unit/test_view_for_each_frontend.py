"""The view each front end gets (nbddp/core/frontends.py), from the evidence the kernel gathers."""
from nbddp.core.frontends import ANSWER_WINDOW_S, Evidence, SendClock, choose, front_end_name, ignored

LAB = {"deletedCells": [], "recordTiming": False, "cellId": "4f0c"}
VSCODE = {"cellId": "vscode-notebook-cell:/home/u/train.ipynb#W2sZmlsZQ%3D%3D"}
NBCLIENT = {"cellId": "4f0c"}


def ev(**kw):
    kw.setdefault("ipywidgets", "8.1.9")
    return Evidence(**kw)


def test_front_end_names():
    assert front_end_name(LAB) == "JupyterLab"
    assert front_end_name(VSCODE) == "VS Code"
    assert front_end_name(NBCLIENT) == "" and front_end_name(None) == ""


def test_widget_front_ends_get_widgets():
    assert choose(ev(metadata=LAB)).view == "widgets"
    assert choose(ev(metadata=VSCODE)).view == "widgets"  # VS Code never opens the control comm
    # a console or any client whose manager opened ipywidgets' control comm
    assert choose(ev(metadata={}, opened_control=True)).view == "widgets"


def test_headless_clients_get_text_silently():
    for metadata in (NBCLIENT, {}, None):
        assert choose(ev(metadata=metadata)) == choose(ev(metadata=metadata), "auto")
        assert choose(ev(metadata=metadata)).view == "text" and choose(ev(metadata=metadata)).why == ""


def test_front_end_without_widget_manager_gets_text_and_how_to_fix_it():
    made = choose(ev(metadata=LAB, closed_probe=True))
    assert made.view == "text" and "jupyterlab_widgets" in made.why and made.why.startswith("nbddp: text view:")
    # the same session's manager later opened the control comm: it renders widgets after all
    assert choose(ev(metadata=LAB, closed_probe=True, opened_control=True)).view == "widgets"


def test_kernel_with_ipywidgets_7_or_none_gets_text_with_the_reason():
    made = choose(ev(ipywidgets="7.7.1", metadata=LAB))
    assert made.view == "text" and "ipywidgets 8" in made.why and "7.7.1" in made.why
    made = choose(ev(ipywidgets="7.7.1", metadata={}))  # Colab sends no JupyterLab metadata
    assert made.view == "text" and "7.7.1" in made.why
    made = choose(ev(ipywidgets=None, metadata=VSCODE))
    assert made.view == "text" and "pip install" in made.why


def test_output_widgets_where_they_cannot_render_says_so():
    made = choose(ev(metadata=LAB, closed_probe=True), "widgets")
    assert made.view == "text" and made.why.startswith("nbddp: --output widgets cannot show here:")
    made = choose(ev(ipywidgets="7.7.1"), "widgets")
    assert made.view == "text" and "7.7.1" in made.why
    assert choose(ev(metadata={}), "widgets").view == choose(ev(metadata=LAB), "widgets").view == "widgets"
    assert choose(ev(metadata=LAB), "widgets").view == "widgets"
    assert choose(ev(metadata=LAB, closed_probe=True), "text").view == "text"


def test_forced_by_environment_and_outside_a_kernel():
    assert choose(ev(forced="widgets", metadata={})).view == "widgets"
    assert choose(ev(forced="text", metadata=LAB)).view == "text"
    assert choose(ev(forced="widgets", metadata=LAB, closed_probe=True)).view == "text"
    assert choose(Evidence(in_kernel=False)).view == "text"


def test_output_is_paced_only_where_a_notebook_server_is_between():
    from nbddp.core.frontends import behind_a_server
    assert behind_a_server(ev(metadata=LAB)) and choose(ev(metadata=LAB), "text").paced
    assert behind_a_server(ev(metadata=VSCODE)) and behind_a_server(ev(metadata={}, opened_control=True))
    for headless in ({}, {"cellId": "c1"}, None):  # papermill, nbclient, jupyter_client: every line
        assert not behind_a_server(ev(metadata=headless)) and not choose(ev(metadata=headless)).paced
    assert not behind_a_server(ev(metadata=LAB, in_kernel=False))


def test_a_manager_that_had_time_to_draw_the_probe_and_did_not_gets_text_saying_which():
    made = choose(ev(metadata=LAB, opened_control=True, ignored_probe=True))
    assert made.view == "text" and "did not draw ipywidgets 8's widgets" in made.why
    assert "jupyterlab_widgets>=3" in made.why and "widgetsnbextension>=4" in made.why
    assert choose(ev(metadata=LAB, opened_control=True, ignored_probe=True), "widgets").view == "text"
    # JupyterLab 3 with a fresh kernel: its manager's control comm failed (no ipywidgets yet)
    assert choose(ev(metadata=LAB, ignored_probe=True)).view == "text"
    # it drew the probe after all (a slow page): widgets; VS Code opens no control comm: not judged
    assert choose(ev(metadata=LAB, opened_control=True, ignored_probe=True, drew_probe=True)).view == "widgets"
    assert choose(ev(metadata=VSCODE, ignored_probe=True)).view == "widgets"
    # a drawing outweighs a closed bare probe, and a client naming nothing that drew gets widgets
    assert choose(ev(metadata=LAB, closed_probe=True, drew_probe=True)).view == "widgets"
    assert choose(ev(metadata={}, drew_probe=True)).view == "widgets"
    assert choose(ev(ipywidgets="7.7.1", metadata=LAB, drew_probe=True)).view == "text"


def test_send_clock_tells_a_cell_sent_later_from_one_queued_behind_others():
    clock = SendClock()
    # the front end's clock is 1000 s behind the kernel's; its first cell starts 10 ms after it was sent
    assert clock.sent_at("s", 0.0, 1000.01) == 1000.01
    # Run All: sent 0.05 s after the first, started 8 s later (queued): sent long before it started
    assert abs(clock.sent_at("s", 0.05, 1008.0) - 1000.06) < 1e-9
    assert not ignored(1000.02, 1000.06)
    # sent by hand 20 s later, started at once: the probe had all that time
    assert abs(clock.sent_at("s", 20.0, 1020.01) - 1020.01) < 1e-9 and ignored(1000.02, 1020.01)
    # each session has its own clock; a header without a date is never judged
    assert clock.sent_at("other", 500.0, 1030.0) == 1030.0
    assert clock.sent_at("s", None, 1040.0) is None and not ignored(1000.0, None) and not ignored(None, 1040.0)
    assert not ignored(0.0, ANSWER_WINDOW_S) and ignored(0.0, ANSWER_WINDOW_S + 0.1)
