"""The editor's light first paint and lazy parts under AppTest: the loss before the charts, expanders
built only while open, and widgets of an earlier plan version that edit nothing."""

import streamlit as st

from frontend import editor_panel, history
from tests.frontend.test_pages import first_paint, open_expander, page


def test_editor_shows_the_loss_first_and_the_charts_once_the_browser_has_shown_it(fake_api):
    at = page("editor")
    loss = at.metric[0].value
    assert at.metric[0].label == "loss (nats)" and not at.get("plotly_chart")
    assert any(c.value.startswith("Drawing the window map") for c in at.caption)
    at = first_paint(at, "editor")
    keys = {c.proto.id for c in at.get("plotly_chart")}
    assert len(keys) == 3 and at.metric[0].value == loss and not at.exception
    assert not any(c.value.startswith("Drawing the window map") for c in at.caption)


def test_editor_generate_panel_shows_both_continuations(fake_api):
    at = page("editor", plan="4.4.4.4_8.full.4.4")
    assert not [t for t in at.text_area if t.key == "editor._gen_prompt"]  # built only while open
    open_expander(at, "editor._gen_open")
    assert not fake_api.called("generate")  # only on the button
    at.text_area(key="editor._gen_prompt").input("abc").run()
    at.slider(key="editor._gen_n").set_value(5).run()
    at.button(key="editor._gen_btn").click().run()
    edited, own = fake_api.called("generate")
    assert edited[1] == ("demo", "abc") and edited[2]["windows"] == [[4, 4, 4, 4], [8, None, 4, 4]]
    assert own[2]["windows"] is None and own[2]["max_new_tokens"] == 5
    texts = [t.value for t in at.text]
    assert "abceeeee" in texts and "abcooooo" in texts
    assert not at.exception


def test_a_replayed_widget_of_an_earlier_plan_edits_nothing():
    """Overlapping reruns send every widget the browser still shows, those drawn for an earlier plan
    too: their values (here a typed 256, i.e. full, and a pill's old label) must not edit the plan."""
    hist = history.PlanHistory(base=[[None, None], [None, None]])
    hist.push([[4, None], [None, None]])
    st.session_state["typed.old"], st.session_state["cell.old"] = 256, "8"
    editor_panel._on_typed(hist, "typed.old", 0, 0, 0, 256)
    editor_panel._on_cell(hist, "cell.old", 0, 0, 1)
    assert hist.current == [[4, None], [None, None]] and hist.version == 1
    st.session_state["typed.new"] = 16
    editor_panel._on_typed(hist, "typed.new", 1, 0, 0, 256)  # the widget drawn for this plan edits it
    assert hist.current == [[16, None], [None, None]]
