"""The view each front end gets (nbddp/core/frontends.py), from the evidence the kernel gathers."""
from nbddp.core.frontends import Evidence, choose, front_end_name

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
