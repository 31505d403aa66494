"""The editor's light first paint and lazy parts under AppTest: the loss before the charts, expanders
built only while open, and the head editor's message log applied once."""

import threading

from frontend import api, head_editor, history
from tests.frontend.test_pages import badges, first_paint, open_expander, page


def test_a_new_session_draws_the_loss_first_and_never_waits_for_the_sweep(fake_api):
    """Issue 23: the cold open's sweep runs in a worker thread and its line in its own fragment, so the
    page's first run draws the loss without waiting for it; the charts come with the browser's first
    paint (a rerun of the charts' own fragment, components.first_paint_done)."""
    release = threading.Event()
    sweep = fake_api.sensitivity

    def slow_sweep(*args, **kwargs):
        assert release.wait(60), "the test never released the sweep"
        return sweep(*args, **kwargs)

    fake_api.sensitivity = slow_sweep
    at = page("editor")  # returns while the sweep is still held: the run did not wait for it
    loss = badges(at)["loss (nats)"]
    assert not at.exception
    assert not at.get("plotly_chart") and any(c.value.startswith("Drawing the charts") for c in at.caption)
    assert any(c.value.startswith("Finding the head to try first") for c in at.caption)
    assert not [i for i in at.info if "needs far context most" in i.value]
    assert [e for e in at.get("bidi_component") if e.proto.component_name == "aah_rerun_timer"]
    release.set()
    api.in_background("sensitivity", "demo", "mixed").result(timeout=60)
    at = first_paint(at, "editor")  # the browser's report, and its timer: the charts and the line are there
    assert len(at.get("plotly_chart")) == 2 and badges(at)["loss (nats)"] == loss  # the loss plot, the token strip
    assert [i for i in at.info if "needs far context most" in i.value]
    assert not [e for e in at.get("bidi_component") if e.proto.component_name == "aah_rerun_timer"]
    assert not any(c.value.startswith("Finding the head") for c in at.caption)


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


def test_editor_retrieval_panel_tables_both_plans_by_distance_and_start(fake_api):
    # the fake API retrieves a key d back when some head sees further than d: the edited plan's farthest
    # window is 8 (nothing retrieved), the model's own plan has full heads (every distance)
    at = page("editor", plan="4.4.4.4_8.8.4.4")
    open_expander(at, "editor._ret_open")
    assert not fake_api.called("retrieval")  # only on the button
    assert any("Press Measure" in i.value for i in at.info)
    at.button(key="editor._ret_btn").click().run()
    edited, own = fake_api.called("retrieval")
    assert edited[2]["windows"] == [[4, 4, 4, 4], [8, 8, 4, 4]] and own[2]["windows"] is None
    tables = [d.value for d in at.dataframe if "distance" in d.value.columns]
    assert len(tables) == 2 and not at.exception
    starts, distances = [0, 8, 16, 24], [8, 16, 24, 25]
    for table, acc in zip(tables, ("0.02", "0.90")):
        assert list(table.columns) == ["distance", "repeat at the end", *[f"key at {s}" for s in starts]]
        assert list(table["distance"]) == distances and list(table["repeat at the end"]) == [acc] * 4
        for s in starts:  # a key at s reproduced d later fits in T = 32 when s + d + 8 <= 33
            assert list(table[f"key at {s}"]) == [acc if s + d + 8 <= 33 else "–" for d in distances]
    assert not any("plan has changed" in c.value for c in at.caption)
    assert any(c.value.startswith("Accuracy per key character, 64 key characters a cell") and
               c.value.endswith("Measured in 0.1 s.") for c in at.caption)  # the fake answers in 30 ms each


def test_a_replayed_log_edits_nothing_and_each_edit_sets_its_own_head():
    """The browser sends its whole unacknowledged log with each message: messages at or below the
    script's ack were applied already and change nothing; the others apply in order, each to the head
    it names (not the selected one)."""
    hist = history.PlanHistory(base=[[None, None], [None, None]])
    log = [{"seq": 1, "kind": "edit", "layer": 0, "head": 0, "window": 4},
           {"seq": 2, "kind": "select", "layer": 1, "head": 1},
           {"seq": 3, "kind": "edit", "layer": 1, "head": 1, "window": 300}]
    ack, picked = head_editor.apply_log(hist, log[:1], 0, 256, 2, 2)
    assert (ack, picked, hist.current) == (1, (0, 0), [[4, None], [None, None]])
    ack, picked = head_editor.apply_log(hist, log, ack, 256, 2, 2)  # seq 1 again, with 2 and 3
    assert (ack, picked) == (3, (1, 1)) and hist.current == [[4, None], [None, None]]  # 300 >= T: full
    assert hist.pos == 1
    ack, _ = head_editor.apply_log(hist, [{"seq": 4, "kind": "edit", "layer": 1, "head": 0, "window": 16}], ack, 256, 2, 2)
    assert hist.current == [[4, None], [16, None]] and hist.pos == 2
    ack, picked = head_editor.apply_log(hist, [{"seq": 5, "kind": "edit", "layer": 5, "head": 0, "window": 1}], ack, 256, 2, 2)
    assert (ack, picked, hist.pos) == (5, None, 2)  # a head this model does not have: skipped, not applied


def test_window_colours_span_the_models_own_context():
    fills, _ = head_editor.window_colors(["1", "16", "256", "full"], 256)
    from plotly.colors import sample_colorscale
    top, bottom = sample_colorscale("Viridis", [1.0, 0.0], colortype="rgb")
    assert fills["256"] == fills["full"] == top and fills["1"] == bottom and fills["16"] not in (top, bottom)
