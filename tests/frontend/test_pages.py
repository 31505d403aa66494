"""Every page under AppTest with a fake API client: renders, widgets drive the right calls, URL state
round-trips, and failures show an error line instead of a traceback."""

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from aah_client import ApiError, ServerBusy, ServiceUnavailable
from frontend import views
from tests.frontend.fake_api import OWN

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["editor", "attention", "runs", "acr", "compare", "present"]


def page(name: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "frontend" / "app_pages" / f"{name}.py"), default_timeout=30)
    for k, v in params.items():
        at.query_params[k] = v
    return at.run()


class BadgeReader(HTMLParser):
    """Collects (label, value) from frontend/badges.py's HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}
        self._label: str | None = None
        self._in_value = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if a.get("class") == "aah-badge":
            self._label = a["data-label"]
        self._in_value = a.get("class") == "aah-value"

    def handle_data(self, data: str) -> None:
        if self._in_value and self._label is not None:
            self.found[self._label] = data
            self._in_value = False


def badges(at: AppTest) -> dict[str, str]:
    """The number badges on the page, label -> value in page order ({} when none are drawn)."""
    reader = BadgeReader()
    for md in at.markdown:
        if 'class="aah-badges"' in md.value:
            reader.feed(md.value)
    return reader.found


def open_expander(at: AppTest, key: str) -> None:
    """What a click on a closed lazy expander (components.lazy_expander) does: set it open and rerun."""
    at.session_state[key] = True
    at.run()


def first_paint(at: AppTest, name: str) -> AppTest:
    """What the browser's first-paint report (components.first_paint_done) does: the charts' fragment
    reruns with its charts (AppTest reruns the page: it has no fragment reruns)."""
    at.session_state[f"_painted.{name}"] = True
    return at.run()


def with_opening_line(at: AppTest, model: str = "demo", eval_set: str = "mixed") -> AppTest:
    """The editor once its sweep (a worker thread: api.in_background) has come back, rerun as the
    browser's timer asks (test_editor_loading.py checks that the first run does not wait for it)."""
    from frontend import api

    api.in_background("sensitivity", model, eval_set).result(timeout=60)
    return at.run()


def heads_component(at: AppTest):
    """The editor's map + pills component (frontend/head_editor.py) and the data it was drawn with."""
    comp = next(e for e in at.get("bidi_component") if e.proto.component_name == "aah_head_editor")
    return comp, json.loads(comp.proto.json)


def send_heads(at: AppTest, *messages: dict) -> AppTest:
    """What the browser component sends: its whole unacknowledged log, numbered from the script's ack
    on (AppTest has no driver for a Components v2 element, so its widget state is built here)."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    comp, data = heads_component(at)
    log = [{**m, "seq": data["ack"] + i} for i, m in enumerate(messages, 1)]
    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=comp.proto.id, json_value=json.dumps({"log": {"log": log}})))
    return at._run(states)


def url(at: AppTest) -> dict:
    return {k: at.query_params[k] for k in at.query_params}


@pytest.mark.parametrize("name", PAGES)
def test_every_page_renders_without_error(fake_api, name):
    fake_api.create_view("v", "editor", {})
    at = page(name)
    assert not at.exception and not at.error
    assert at.title or name == "present"


def test_app_entry_navigates_and_present_mode_hides_navigation(fake_api):
    at = AppTest.from_file(str(ROOT / "frontend" / "app.py"), default_timeout=30).run()
    assert not at.exception and at.title[0].value == "Window editor"
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception and at.title[0].value == "Compare runs"


@pytest.mark.parametrize("name", PAGES)
def test_service_down_shows_an_error_line_not_a_traceback(fake_api, name):
    down = ServiceUnavailable("cannot reach the API at http://127.0.0.1:9: connection refused")
    fake_api.fail = {m: down for m in ("models", "runs", "views", "presets")}
    at = page(name)
    assert not at.exception
    assert any("not reachable" in e.value for e in at.error)


def test_a_busy_api_shows_a_busy_line_and_the_browser_asks_again(fake_api, monkeypatch):
    """429 (the API's heavy queue is full): the script does not sleep; one "busy" line, and a timer in
    the browser (frontend/rerun_timer.py) set to the Retry-After reruns the fragment; that rerun,
    with the API free again, shows the loss. Never a traceback."""
    busy = ServerBusy("the server is busy: 3 heavy jobs are running or queued (limit 3)", 2.0)
    answered = fake_api.evaluate
    tries = []

    def evaluate_busy_once(*args, **kwargs):
        tries.append(args)
        if len(tries) == 1:
            raise busy
        return answered(*args, **kwargs)

    monkeypatch.setattr(fake_api, "evaluate", evaluate_busy_once)
    at = page("editor")
    assert not at.exception and not at.error and len(tries) == 1 and not badges(at)
    assert any("busy" in w.value and "asking again in 2 s" in w.value for w in at.warning)
    timer, = [e for e in at.get("bidi_component") if e.proto.component_name == "aah_rerun_timer"]
    assert json.loads(timer.proto.json)["ms"] == 2000
    at.run()  # what the timer's trigger does: a rerun
    assert len(tries) == 2 and "loss (nats)" in badges(at)
    assert not [w for w in at.warning if "busy" in w.value]


def test_editor_evaluates_the_models_own_plan_with_per_token(fake_api):
    at = page("editor")
    (_, args, kwargs), = fake_api.called("evaluate")
    assert args == ("demo", OWN) and kwargs == {"eval_set": "mixed", "per_token": True}
    assert list(badges(at)) == ["loss (nats)", "Δloss vs own plan", "perplexity", "acr", "causal_coverage"]
    assert badges(at)["Δloss vs own plan"] == "+0.0000"


def test_editor_opens_with_a_sentence_from_the_models_own_sweep(fake_api):
    at = with_opening_line(page("editor"))
    assert fake_api.called("sensitivity")[0][2] == {"eval_set": "mixed"}
    line = next(i.value for i in at.info if "needs far context most" in i.value)
    assert "layer 1 head 2" in line and "set it to 4" in line  # the fake sweep's worst head, its smallest window
    # picked on the eval set, checked on a held-out one (issue 23): both numbers are said
    assert "picked on mixed; on held-out english the same edit changes the loss by +0.125 nats" in line


def test_editor_cell_edit_evaluates_the_new_plan_and_updates_the_url(fake_api):
    at = page("editor")
    at = send_heads(at, {"kind": "select", "layer": 1, "head": 3})
    assert heads_component(at)[1]["sel"] == [1, 3] and url(at)["layer"] == "1"
    at = send_heads(at, {"kind": "edit", "layer": 1, "head": 3, "window": 16})
    plan = [list(r) for r in OWN]
    plan[1][3] = 16
    assert fake_api.called("evaluate")[-1][1] == ("demo", plan)
    assert url(at)["plan"] == "4.8.full.16_8.full.4.16" and url(at)["layer"] == "1" and url(at)["head"] == "3"
    assert badges(at)["Δloss vs own plan"] != "+0.0000"
    at.button(key="editor._undo").click().run()
    assert "plan" not in url(at)  # back to the model's own plan
    at.button(key="editor._redo").click().run()
    assert url(at)["plan"] == "4.8.full.16_8.full.4.16"


def test_editor_takes_any_typed_window_not_only_the_buckets(fake_api):
    at = page("editor", layer="1", head="2")
    assert heads_component(at)[1]["sel"] == [1, 2]
    at = send_heads(at, {"kind": "edit", "layer": 1, "head": 2, "window": 13})  # 13 is no bucket of this model
    plan = [list(r) for r in OWN]
    plan[1][2] = 13
    assert fake_api.called("evaluate")[-1][1] == ("demo", plan) and url(at)["plan"] == "4.8.full.16_8.full.13.4"
    assert "13" in heads_component(at)[1]["labels"] and at.button(key="editor._undo").disabled is False
    at = send_heads(at, {"kind": "edit", "layer": 1, "head": 2, "window": 32})  # the context (T=32): full
    assert fake_api.called("evaluate")[-1][1][1][1][2] is None


def test_editor_applies_every_message_of_the_log_once_and_to_its_own_head(fake_api):
    """Several messages arrive in one rerun (the browser sends its whole unacknowledged log): each is
    applied once, in order, to the head it names, whatever head the page had selected."""
    at = page("editor", layer="0", head="0")
    at = send_heads(at, {"kind": "edit", "layer": 1, "head": 0, "window": 2},
                    {"kind": "select", "layer": 0, "head": 3},
                    {"kind": "edit", "layer": 0, "head": 3, "window": 1})
    plan = [list(r) for r in OWN]
    plan[1][0], plan[0][3] = 2, 1
    assert fake_api.called("evaluate")[-1][1] == ("demo", plan)
    comp, data = heads_component(at)
    assert data["ack"] == 3 and data["sel"] == [0, 3] and data["plan"] == plan
    assert "step 2 of 2" in " ".join(c.value for c in at.caption)
    # the same log again (a replay): nothing more happens
    from streamlit.proto.WidgetStates_pb2 import WidgetState
    log = [{"kind": "edit", "layer": 1, "head": 0, "window": 2, "seq": 1}]
    states = at._tree.get_widget_states()
    states.widgets.append(WidgetState(id=comp.proto.id, json_value=json.dumps({"log": {"log": log}})))
    at = at._run(states)
    assert "step 2 of 2" in " ".join(c.value for c in at.caption)


def test_editor_opens_the_plan_from_a_shared_link(fake_api):
    at = page("editor", plan="4.4.4.4_8.full.4.4", eval="copy", layer="1")
    assert fake_api.called("evaluate")[-1][1] == ("demo", [[4, 4, 4, 4], [8, None, 4, 4]])
    assert fake_api.called("evaluate")[-1][2]["eval_set"] == "copy"
    assert url(at) == {"model": "demo", "plan": "4.4.4.4_8.full.4.4", "eval": "copy", "layer": "1"}
    assert heads_component(at)[1]["sel"] == [1, 0]


def test_editor_ignores_a_misshaped_plan_in_the_url(fake_api):
    page("editor", plan="4.4_8")
    assert fake_api.called("evaluate")[-1][1] == ("demo", OWN)


def test_editor_presets_and_bulk_edits(fake_api):
    at = page("editor")  # the expander is a plain one: its widgets are there (opening it is no rerun)
    at.selectbox(key="editor._preset").select("all full").run()
    at.button(key="editor._apply").click().run()
    assert fake_api.called("evaluate")[-1][1][1] == [[None] * 4, [None] * 4]
    at.selectbox(key="editor._preset").select("budgeted allocation").run()
    at.slider(key="editor._budget").set_value(0.3).run()
    at.button(key="editor._apply").click().run()
    (_, args, kwargs), = fake_api.called("allocate")
    assert args == ("demo", 0.3) and kwargs["metric"] == "causal_coverage"
    assert fake_api.called("evaluate")[-1][1][1] == [[8] * 4, [8] * 4]
    # both numbers: in-sample on the choosing set, and on the held-out set (the fake: +0.25 worse there)
    res = fake_api.allocate("demo", 0.3)
    ins, held = res["loss"] - res["baseline_loss"], res["held_out_loss"] - res["held_out_baseline_loss"]
    note = next(c.value for c in at.caption if c.value.startswith("Allocated plan"))
    assert f"Δloss {ins:+.4f} on mixed, where it was chosen (in-sample)" in note
    assert f"Δloss {held:+.4f} on held-out english (not used to choose)" in note
    at.selectbox(key="editor._bulk_layer").select(0).run()
    at.selectbox(key="editor._bulk_lw").select("4").run()
    at.button(key="editor._set_layer").click().run()
    assert fake_api.called("evaluate")[-1][1][1] == [[4] * 4, [8] * 4]
    at.button(key="editor._reset").click().run()
    assert "plan" not in url(at) and not at.exception  # own plan again (its evaluation is cached)


def test_editor_shows_the_servers_refusal(fake_api):
    fake_api.fail = {"evaluate": ApiError(422, "windows: layer 0, head 0: window 0 is invalid")}
    at = page("editor")
    assert not at.exception
    # the server's detail is shown as text: escaped for Markdown, the backslashes are not displayed
    assert any("422" in e.value and "layer 0, head 0" in e.value.replace("\\", "") for e in at.error)


def test_save_view_posts_the_page_state(fake_api):
    at = page("editor", plan="4.4.4.4_8.full.4.4")
    assert not at.code  # the share bar is built only while open
    open_expander(at, "editor._share")
    at.text_input(key="editor._viewname").input("all 4 in L0").run()
    at.button(key="editor._saveview").click().run()
    (_, args, _), = fake_api.called("create_view")
    assert args == ("all 4 in L0", "editor", {"model": "demo", "plan": "4.4.4.4_8.full.4.4"})
    assert "http://127.0.0.1:8501/?model=demo&plan=4.4.4.4_8.full.4.4" in [c.value for c in at.code]


def test_attention_url_state_drives_the_request_and_round_trips(fake_api):
    params = {"model": "demo", "text": "c1", "layer": "1", "head": "2", "window": "8"}
    at = page("attention", **params)
    (_, args, kwargs), *heads = fake_api.called("attention")
    assert args == ("demo", 1, 2) and kwargs == {"text_id": "c1", "window": 8}
    # the layer's other heads for the small multiples (head 2's maps come from the cache)
    assert sorted(a for _, a, _ in heads) == [("demo", 1, 0), ("demo", 1, 1), ("demo", 1, 3)]
    assert url(at) == params
    at.selectbox(key="attention.window").select("full").run()
    assert fake_api.called("attention")[-1][2]["window"] is None  # full is null, as in a plan
    at.selectbox(key="attention.window").select("own").run()
    assert fake_api.called("attention")[-1][2]["window"] == "own"  # the head's own window, asked explicitly
    at.toggle(key="attention.sens").set_value(True).run()
    assert fake_api.called("sensitivity") and not at.exception
    at.selectbox(key="attention.scale").select("log").run()
    assert url(at)["scale"] == "log" and not at.exception  # the colour scale is part of the link


def test_runs_filters_launch_and_cancel(fake_api):
    at = page("runs", status="RUNNING")
    assert any(kw["status"] == "RUNNING" for _, _, kw in fake_api.called("runs"))
    at.text_area(key="runs._overrides").input("train.max_steps=20\nmodel.n_layer=2")
    at.text_input(key="runs._name").input("smoke")
    at.button[[b.key for b in at.button].index("FormSubmitter:runs._launch-Launch")].click().run()
    (_, args, kwargs), = fake_api.called("create_run")
    assert args == ("demo",) and kwargs["overrides"] == {"train.max_steps": 20, "model.n_layer": 2}
    assert kwargs["name"] == "smoke" and kwargs["target"] == "local" and kwargs["resources"] == {}
    at.button(key="runs._cancel.2").click().run()
    assert fake_api.called("cancel_run")[0][1] == (2,)
    assert fake_api.called("run_logs")[0][1] == (2,)  # the running job's log tail is shown


def test_runs_launches_on_a_cluster_target_with_resources(fake_api):
    at = page("runs")
    assert [o for o in at.selectbox(key="runs._target").options] == ["local", "ray"]
    at.selectbox(key="runs._target").select("ray").run()
    assert any("1 of 1 GPUs free" in c.value for c in at.caption)  # what the target has free
    at.number_input(key="runs._res.gpus").set_value(1)
    at.number_input(key="runs._res.memory_gb").set_value(8)
    at.button[[b.key for b in at.button].index("FormSubmitter:runs._launch-Launch")].click().run()
    (_, _, kwargs), = fake_api.called("create_run")
    assert kwargs["target"] == "ray" and kwargs["resources"] == {"gpus": 1, "memory_gb": 8.0}


def test_runs_rejects_bad_overrides_without_calling_the_api(fake_api):
    at = page("runs")
    at.text_area(key="runs._overrides").input("no equals sign")
    at.button[[b.key for b in at.button].index("FormSubmitter:runs._launch-Launch")].click().run()
    assert not fake_api.called("create_run") and any("key=value" in e.value for e in at.error)


def test_acr_page_reads_run_and_step_from_the_url(fake_api):
    at = page("acr", run="2", step="10", smooth="0.3")
    assert fake_api.called("run_metrics")[0][1] == (2,)
    # long runs come downsampled: every read asks for at most views.CURVE_POINTS per series, whole range
    assert all(c[2]["max_points"] == 2000 and c[2].get("max_step") is None for c in fake_api.called("run_metrics"))
    assert (2,) in [c[1] for c in fake_api.called("run_windows")] and fake_api.called("run_windows")[-1][2] == {"step": 10}
    assert url(at)["run"] == "2" and url(at)["step"] == "10" and url(at)["smooth"] == "0.3"
    # run 2 is RUNNING: its latest plan (and list of steps) is fetched afresh on every rerun, not cached
    latest = lambda: [c for c in fake_api.called("run_windows") if c[1] == (2,) and c[2].get("step") is None]  # noqa: E731
    n = len(latest())
    at.run()
    assert len(latest()) == n + 1 and not at.exception


def test_compare_page_aggregation_and_window_diff(fake_api):
    at = page("compare", runs="1,2", agg="max", keys="val_loss,acr")
    (_, args, kwargs), = fake_api.called("compare_runs")
    assert args == ([1, 2],) and kwargs == {"keys": ["val_loss", "acr"], "agg": "max", "step": None,
                                           "max_points": views.CURVE_POINTS}
    assert fake_api.called("windows_diff")
    # the diff's pair is part of the view (issue 23: a saved view restores every control)
    assert url(at) == {"runs": "1,2", "agg": "max", "keys": "val_loss,acr", "diffa": "1", "diffb": "2"}
    at.selectbox(key="compare.agg").select("at_step").run()
    at.number_input(key="compare.step").set_value(20).run()
    assert fake_api.called("compare_runs")[-1][2] == {"keys": ["val_loss", "acr"], "agg": "at_step", "step": 20,
                                                      "max_points": views.CURVE_POINTS}
    assert "val_loss @ step" in at.dataframe[0].value.columns  # the step each value was read at
    assert not at.error


def test_a_bad_link_keeps_what_is_valid_and_says_what_was_ignored(fake_api):
    at = page("attention", layer="abc", head="2", foo="1")
    assert at.session_state["attention.head"] == 2 and at.session_state["attention.layer"] == 0
    (warning,) = [w.value for w in at.warning if "Ignored from the link" in w.value]
    assert "layer=abc (not an integer)" in warning and "foo=1" in warning
    at = page("acr", run="99999")
    assert any("run=99999 (no such run; showing run #1)" in w.value for w in at.warning)
    at = page("editor", plan="0.4.4.4_8.full.4.4")
    (warning,) = [w.value for w in at.warning if "Ignored from the link" in w.value]
    windows = fake_api.called("evaluate")[-1][1][1]
    assert "L0H0='0'" in warning and windows == [[OWN[0][0], 4, 4, 4], [8, None, 4, 4]]
    assert not at.exception and not at.error
    assert not [w for w in page("attention", layer="1").warning if "Ignored" in w.value]


def test_compare_keeps_models_apart_by_default(fake_api):
    at = page("compare", paper="1")  # the paper's run is listed, but the default pick is one model's runs
    assert at.session_state["compare.runs"] == [1, 2]
    at = page("compare", paper="1", runs="1,3")  # asked for: said, and drawn on separate axes
    assert any("different models" in i.value for i in at.info) and not at.error


def test_present_steps_through_saved_views(fake_api):
    fake_api.create_view("edit", "editor", {"plan": "4.4.4.4_8.full.4.4"})
    fake_api.create_view("head", "attention", {"layer": "1", "head": "3"})
    at = page("present")
    assert at.header[0].value == "edit" and fake_api.called("evaluate")
    at.button(key="present._next").click().run()
    assert at.header[0].value == "head" and url(at)["slide"] == "1"
    assert fake_api.called("attention")[0][1] == ("demo", 1, 3)  # its maps first, then the layer's other heads
    at.button(key="present._mode").click().run()
    assert url(at)["mode"] == "present" and not at.exception


def test_present_mode_from_a_link(fake_api):
    fake_api.create_view("edit", "editor", {})
    at = page("present", mode="present", slide="0")
    assert not at.exception and not at.title and at.header[0].value == "edit"


def test_frontend_never_imports_torch():
    code = ("import sys, importlib\n"
            "for m in ['aah_client', 'frontend.plans', 'frontend.history', 'frontend.url_state', 'frontend.run_table',\n"
            "          'frontend.figures', 'frontend.export', 'frontend.api',\n"
            "          'frontend.components', 'frontend.views', 'frontend.editor_panel']:\n"
            "    importlib.import_module(m)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'aah_core', 'backend')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=60)


def test_editor_draws_the_allocation_curve_without_changing_the_plan(fake_api):
    at = first_paint(page("editor"), "editor")
    at.button(key="editor._curvebtn").click().run()
    (_, args, kwargs), = fake_api.called("allocate")
    assert args == ("demo", 0.1) and not at.exception
    assert "plan" not in url(at)  # the plan is unchanged
    at.run()
    assert not [b for b in at.button if b.key == "editor._curvebtn"]  # the curve is kept; no button
    at.selectbox(key="editor.eval").set_value("copy").run()  # its losses were on "mixed": not shown now
    assert [b for b in at.button if b.key == "editor._curvebtn"] and not at.exception
    at.button(key="editor._curvebtn").click().run()
    assert fake_api.called("allocate")[-1][2]["eval_set"] == "copy"


def test_present_button_hides_the_navigation_at_once(fake_api):
    fake_api.create_view("edit", "editor", {})
    at = AppTest.from_file(str(ROOT / "frontend" / "app.py"), default_timeout=30).run()
    at.switch_page("app_pages/present.py").run()
    assert at.sidebar.caption  # the API line sits in the sidebar outside present mode
    at.button(key="present._mode").click().run()
    assert not at.exception and not at.sidebar.caption and url(at)["mode"] == "present"


def test_attention_on_the_users_own_text(fake_api):
    at = page("attention", text="own")
    assert not fake_api.called("attention") and at.info  # asks for a text first
    at.text_area(key="attention._own_text").input("def f(x): return x").run()
    (_, args, kwargs), *heads = fake_api.called("attention")
    assert args == ("demo", 0, 0) and kwargs["text"] == "def f(x): return x" and not at.exception
    assert all(kw["text"] == "def f(x): return x" for _, _, kw in heads)  # the small multiples: same text
    # issue 23: the retained-mass curve and τ's suggestion are computed on this text, not the bundled ones
    assert fake_api.called("retained_mass_of_text")[-1][1] == ("demo", "def f(x): return x", 0)
    assert not fake_api.called("retained_mass")
    at.run()
    mass = fake_api.retained_mass_of_text("demo", "x")["mass"][0][0]
    drawn = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("attention._retained")).proto.spec)
    assert mass in [t["y"] for t in drawn["data"]]


def test_editor_shows_the_exact_cost_beside_the_loss_for_every_edit(fake_api):
    at = page("editor")
    # OWN at T=32: kv entries 4+8+32+16 + 8+32+4+4 = 108 of 256
    assert any("KV cache 42.2 % of full · attention pairs" in m.value for m in at.markdown)
    at.selectbox(key="editor._preset").select("all full").run()
    at.button(key="editor._apply").click().run()
    assert any("KV cache 100.0 % of full · attention pairs 100.0 % of full" in m.value for m in at.markdown)
    assert len(fake_api.called("cost")) == 0  # the figures come with the evaluation: no extra call


def test_attention_on_a_long_own_text_says_what_is_shown_and_moves_the_span(fake_api):
    at = page("attention", text="own")
    at.text_area(key="attention._own_text").input("x" * 40).run()
    assert any("Showing tokens 1–6 of 40" in w.value and "34 after" in w.value for w in at.warning)
    at.slider(key="attention._offset").set_value(20).run()
    assert fake_api.called("attention")[-1][2]["offset"] == 20
    assert any("Showing tokens 21–26 of 40" in w.value for w in at.warning) and not at.exception


def test_editor_offers_a_hugging_face_model_with_its_native_windows_and_context_buckets(fake_api, monkeypatch):
    """An HF model as the API lists it: family in the picker, its own (native sliding/global) plan on the
    window map and evaluated, window choices the powers of two below its context plus full."""
    native = [[8, 8, 8, 8], [None, None, None, None]]  # a sliding layer, then a global one
    hf = {"id": "gemma-tiny", "name": "gemma-tiny", "n_layer": 2, "n_head": 4, "seq_len": 32, "preset": None,
          "buckets": [1, 2, 4, 8, 16, None], "n_params": 5000, "run_id": None, "family": "gemma3",
          "dtype": "float32"}
    demo = fake_api.models()[0]
    monkeypatch.setattr(fake_api, "models", lambda: [demo, hf])
    own_windows = fake_api.model_windows
    monkeypatch.setattr(fake_api, "model_windows", lambda model_id: {**own_windows(model_id), "windows": native}
                        if model_id == "gemma-tiny" else own_windows(model_id))
    at = first_paint(page("editor", model="gemma-tiny"), "editor")
    assert not at.exception
    picker = at.selectbox(key="editor.model")
    assert picker.value == "gemma-tiny" and "gemma3, 2×4 heads, T=32" in picker.format_func("gemma-tiny")
    assert fake_api.called("evaluate")[-1][1] == ("gemma-tiny", native)
    data = heads_component(at)[1]
    assert data["labels"] == ["1", "2", "4", "8", "16", "full"]
    assert data["plan"] == native


def test_present_renames_reorders_and_deletes_saved_views(fake_api):
    for name in ("a", "b", "c"):
        fake_api.create_view(name, "editor", {})
    at = page("present")
    assert at.session_state["present.deck"] == [1, 2, 3]
    at.button(key="present._down.1").click().run()
    assert fake_api.called("order_views")[-1][1] == ([2, 1, 3],)
    assert at.session_state["present.deck"] == [2, 1, 3]  # the deck follows the stored order
    at.text_input(key="present._name.3").input("the last one")
    at.button(key="present._rename.3").click().run()
    assert fake_api.called("rename_view")[-1][1] == (3, "the last one") and fake_api.views_store[2]["name"] == "the last one"
    at.button(key="present._delete.2").click().run()
    assert [v["id"] for v in fake_api.views_store] == [1, 3] and at.session_state["present.deck"] == [1, 3]
    assert not at.exception and not at.error


def test_acr_steps_slider_asks_the_server_again_for_that_range(fake_api):
    """Zooming (the Steps slider: Streamlit does not report Plotly's own zoom) re-asks for the range only,
    still at most 2,000 points per series; the whole range again leaves both ends open."""
    at = page("acr", run="1")
    at.slider(key="acr.steps.1").set_value((10, 20)).run()
    assert not at.exception
    zoomed = [c[2] for c in fake_api.called("run_metrics") if c[2]["min_step"] is not None]
    assert zoomed and all(c["max_points"] == 2000 for c in zoomed)
    assert (zoomed[-1]["min_step"], zoomed[-1]["max_step"]) == (10, 20)
    n = len(fake_api.called("run_metrics"))
    at.slider(key="acr.steps.1").set_value((0, 30)).run()
    later = fake_api.called("run_metrics")[n:]
    assert later and all(c[2]["min_step"] is None and c[2]["max_step"] is None for c in later)


def test_editor_serving_table_shows_every_grain_and_loads_a_rounded_plan(fake_api):
    from tests.frontend.fake_api import FakeApi

    at = page("editor")
    assert not fake_api.called("round_plan")  # asked only while its expander is open
    open_expander(at, "editor._serving")
    asked = {(c[2]["granularity"], c[2]["mode"]) for c in fake_api.called("round_plan")}
    assert asked == {(g, m) for g in ("head", "kv_group", "layer", "transformers") for m in ("up", "budget")}
    expected = FakeApi().round_plan("demo", OWN, granularity="layer", mode="up")
    shown = [m.value for m in at.markdown]
    assert f"{expected['kv_bytes']:,}" in shown and f"{expected['delta']:+.4f}" in shown
    at.button(key=next(b.key for b in at.button if b.key.startswith("editor._load.layer.up."))).click().run()
    assert fake_api.called("evaluate")[-1][1] == ("demo", expected["windows"])
    assert expected["windows"] == [[None] * 4, [None] * 4]  # OWN has a full head in each layer
    assert url(at)["plan"] == "full.full.full.full_full.full.full.full"
    at.button(key="editor._undo").click().run()  # loading was one undoable edit
    assert "plan" not in url(at)


def _hover_texts(at: AppTest) -> list[str]:
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return [h for c in charts for t in c["data"] for h in t.get("hovertext") or []]


def test_acr_page_and_compare_curves_mark_a_nan_the_series_holds(fake_api):
    """The fake's train_loss holds a NaN at step 20 (sent as "nan", listed in `nonfinite`): the ACR page
    and Compare's curves draw it as a marker that says what it is."""
    acr = page("acr", run="1", keys="train_loss")
    assert not acr.exception and "NaN at step 20 · train_loss" in _hover_texts(acr)
    data = fake_api.compare_runs([1, 2], keys=["train_loss"])
    figs = views.compare_figures(data, ["train_loss"], 0.0)
    hovers = [h for fig in figs.values() for t in fig.data if t.yaxis == "y2" for h in t.hovertext]
    assert sorted(hovers) == sorted(f"NaN at step 20 · #{r['id']} {r['name']}" for r in data["runs"])


def test_editor_captions_the_models_dtype_and_its_loss_difference(fake_api, monkeypatch):
    own = fake_api.models()[0]
    precision = {"dtype": "bfloat16", "choice": "measured", "bf16_speedup": 4.25, "loss_float32": 3.5,
                 "loss_bfloat16": 3.5123, "loss_delta": 0.0123, "tokens": 1024}
    monkeypatch.setattr(fake_api, "models", lambda: [{**own, "dtype": "bfloat16", "precision": precision}])
    at = page("editor")
    caption = next(c.value for c in at.caption if "Evaluated in" in c.value)
    assert "bfloat16" in caption and "4.2× as fast" in caption and "Δ +0.0123" in caption and "1,024 tokens" in caption
    assert f"Each eval set: 4 × {own['seq_len']:,} = {4 * own['seq_len']:,} tokens" in caption


def test_the_jobs_watcher_polls_only_while_a_job_is_live(fake_api, monkeypatch):
    """No timer reruns when nothing is live (issue 23): the watcher's fragment gets run_every only while
    a job is scheduled or running; idle, a "Check for jobs" button looks once instead."""
    import streamlit as st

    from frontend import jobs

    timers = []
    fragment = st.fragment

    def spy(func=None, *, run_every=None):
        if getattr(func, "__name__", "") == "_watch":
            timers.append(run_every)
        return fragment(func, run_every=run_every)

    monkeypatch.setattr(st, "fragment", spy)
    at = page("runs")  # the fake store has run #2 RUNNING
    assert timers == [jobs.POLL_S] and not [b for b in at.button if b.key == "jobs._check"]
    for r in fake_api.runs_store:
        r["status"] = "FINISHED" if r["status"] == "RUNNING" else r["status"]
    at = page("runs")
    assert timers[-1] is None and at.button(key="jobs._check") and not at.exception


@pytest.mark.parametrize("view_page,view_state", [("acr", {"run": "1"}),
                                                   ("attention", {"sens": True, "layer": 1})])  # 7 charts
def test_present_reports_a_slide_beyond_the_deck_and_sizes_the_slide_to_one_screen(fake_api, view_page, view_state):
    from frontend import export

    for name in ("a", "b"):
        fake_api.create_view(name, view_page, view_state)
    at = page("present", slide="50")
    assert any("slide=50 (the deck has 2 slides; showing slide 1)" in w.value for w in at.warning)
    assert any("slide 1 of 2" in c.value for c in at.caption)
    heights = [json.loads(c.proto.spec)["layout"]["height"] for c in at.get("plotly_chart")]
    rows = -(-len(heights) // export.slide_columns(len(heights)))
    lines = len([m for m in at.markdown if m.value.startswith("- ")])  # the slide's lines, above its charts
    assert heights and rows * max(heights) + lines * export.LINE_PX <= export.SCREEN_PX - export.SLIDE_CHROME_PX


def test_a_gqa_model_draws_kv_groups_and_says_when_an_edit_cannot_shrink_the_cache(fake_api, monkeypatch):
    """Issue 23: with grouped-query attention a one-head edit leaves the KV cache at 100 %; the map draws
    the groups and the cost line says why."""
    from aah_core.inference.cost import ModelShape
    from tests.frontend import fake_api as fake_module

    monkeypatch.setattr(fake_module, "SHAPE", ModelShape(n_layer=2, n_head=4, n_kv_head=2, head_dim=8, seq_len=32))
    at = page("editor")
    assert heads_component(at)[1]["group"] == 2
    full = [[None] * 4, [None] * 4]
    at = page("editor", plan="f.f.f.f_f.f.f.f")
    at = send_heads(at, {"kind": "edit", "layer": 0, "head": 0, "window": 1})  # its group partner stays full
    assert fake_api.called("evaluate")[-1][1][1] == [[1, None, None, None], full[1]]
    assert any(c.value.startswith("L0H0: this edit cannot shrink the KV cache: 2 query heads share each KV head")
               for c in at.caption)
    at = send_heads(at, {"kind": "edit", "layer": 0, "head": 1, "window": 1})  # the whole group: it shrinks
    assert not any("cannot shrink the KV cache" in c.value for c in at.caption)


def test_the_live_acr_page_keeps_val_loss_chosen_before_the_first_eval(fake_api, monkeypatch):
    """Issue 23: opened before a live run's first evaluation, the page dropped val_loss for good."""
    logged = fake_api.run_metrics
    evals = {"done": False}

    def before_first_eval(run_id, **kwargs):
        out = logged(run_id, **kwargs)
        if not evals["done"]:
            out["series"].pop("val_loss")
        return out

    monkeypatch.setattr(fake_api, "run_metrics", before_first_eval)
    at = page("acr", run="2")  # run #2 is RUNNING in the fake store
    assert at.multiselect(key="acr.keys").value == ["val_loss", "train_loss"]
    assert any("Not logged yet: val_loss" in c.value for c in at.caption)
    evals["done"] = True  # the run evaluates: the next redraw draws val_loss
    at.run()
    drawn = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("acr._metrics")).proto.spec)
    assert "val_loss" in [t["name"] for t in drawn["data"]] and not at.exception


def test_a_plan_for_a_model_that_is_not_here_is_reported_not_dropped(fake_api):
    """Issue 23: plan=garbage was dropped silently when the model was also bad."""
    at = page("editor", model="nope", plan="garbage")
    text = " ".join(w.value for w in at.warning)
    assert "model=nope (no such model" in text and "plan=garbage (made for model nope" in text
    assert fake_api.called("evaluate")[-1][1] == ("demo", OWN) and not at.exception


def test_editor_sink_count_starts_at_the_models_own_and_is_sent_when_changed(fake_api):
    at = page("editor")
    box = at.number_input(key="editor.sinks.demo")
    assert box.value == 0 and "trained with 0" in box.help  # the model's own count (fake: 0)
    assert "sinks" not in fake_api.called("evaluate")[-1][2]  # its own: the API's default, not sent
    before = badges(at)["loss (nats)"]
    at = box.set_value(4).run()
    (_, args, kwargs) = fake_api.called("evaluate")[-1]
    assert args == ("demo", OWN) and kwargs == {"eval_set": "mixed", "per_token": True, "sinks": 4}
    assert not at.exception and badges(at)["loss (nats)"] != before  # the loss shown is the one evaluated with sinks
    at = at.number_input(key="editor.sinks.demo").set_value(0).run()
    assert badges(at)["loss (nats)"] == before  # back to the model's own: the first answer (served from the cache)
    assert all("sinks" not in kwargs for _, _, kwargs in fake_api.called("evaluate")[:-1])


@pytest.mark.parametrize("name,link", [("editor", {}), ("acr", {"run": "1", "band": "std", "keys": "val_loss,train_loss"}),
                                       ("compare", {"runs": "1,2", "keys": "val_loss,acr"}),
                                       ("compare", {"mode": "groups", "keys": "val_loss"}),
                                       ("compare", {"mode": "reproduction"}), ("attention", {"sens": "1"})])
def test_no_chart_titles_an_axis_value(fake_api, name, link):
    """Issue 23: y axes were titled "value"; every axis of every chart a page draws names what it shows."""
    at = first_paint(page(name, **link), name)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert specs and not at.exception
    for spec in specs:
        axes = {k: v for k, v in spec["layout"].items() if k.startswith(("xaxis", "yaxis"))}
        titles = [(a.get("title") or {}).get("text") if isinstance(a.get("title"), dict) else a.get("title")
                  for a in axes.values()]
        assert "value" not in [t.strip().lower() for t in titles if isinstance(t, str)], (spec["layout"].get("title"), titles)


def test_an_edit_whose_request_carried_a_stale_url_still_sends_its_plan(fake_api, monkeypatch):
    """Issue 23 (the 40-click browser test's flake): edits a then b in quick succession. The request for
    b left the browser before a's URL arrived, so it carried the URL from before a, which already said b;
    the run for b then sent no URL, a's arrived after it, and the address bar said a. The page sends
    its URL when it differs from the last one it sent, whatever the request carried."""
    from streamlit.runtime.state.query_params_proxy import QueryParamsProxy

    sent: list[dict] = []
    real = QueryParamsProxy.from_dict
    monkeypatch.setattr(QueryParamsProxy, "from_dict", lambda self, params: (sent.append(dict(params)), real(self, params))[1])
    at = first_paint(page("editor"), "editor")
    at = send_heads(at, {"kind": "edit", "layer": 0, "head": 0, "window": 8})  # b
    b = url(at)["plan"]
    at = send_heads(at, {"kind": "edit", "layer": 0, "head": 0, "window": 16})  # a
    assert sent[-1]["plan"] not in (b, None)
    at.query_params["plan"] = b  # the browser's URL when it sent the next edit: a's had not arrived
    sent.clear()
    send_heads(at, {"kind": "edit", "layer": 0, "head": 0, "window": 8})  # b again
    assert [s.get("plan") for s in sent] == [b]  # sent, though the request already said b


def test_the_attention_pages_sweep_says_its_pick_on_both_sets(fake_api):
    """Issue 23: the sweep chooses on one eval set; the page says the pick's Δloss there and on the held-out set."""
    at = page("attention", sens="1")
    sweep = fake_api.sensitivity("demo")
    line = next(c.value for c in at.caption if c.value.startswith("The head this sweep singles out"))
    assert f"L1H2 at window 4, +{sweep['pick']['delta']:.3f} nats on mixed (where it was picked)" in line
    assert f"+{sweep['pick']['held_out_delta']:.3f} nats on held-out english (not used to pick it)" in line


def test_a_runs_slide_on_present_is_a_table_as_on_the_runs_page(fake_api):
    """Present draws the Runs slide's table as the Runs page does (a dataframe, not a Plotly table, which
    draws every cell as SVG), with the slide's rows and columns."""
    fake_api.create_view("runs", "runs", {"paper": False})
    at = page("present")
    table = views.build_section("runs", {"paper": False}).figures["table"].data[0]
    shown = at.dataframe[0].value
    assert list(shown.columns) == list(table.header.values) and not at.get("plotly_chart")
    assert [list(map(str, col)) for col in table.cells.values] == [list(map(str, shown[c])) for c in shown.columns]
    assert len(shown) == 2  # the paper's row is left out, as the view asks


def test_editor_table_is_built_while_its_expander_is_open_and_edits_the_plan(fake_api):
    """'Edit as a table' (a lazy expander: the browser loads no data grid for a closed one): no table
    until it is opened; a cell set in it is an edit of the plan (evaluated, in the URL)."""
    at = first_paint(page("editor"), "editor")
    assert not at.get("dataframe")
    open_expander(at, "editor._table_open")
    table, = at.get("dataframe")
    states = at._tree.get_widget_states()
    edit = {"edited_rows": {"0": {"H0": "full"}}, "added_rows": [], "deleted_rows": []}
    states.widgets.add(id=table.proto.id, string_value=json.dumps(edit))
    at._run(states)
    assert fake_api.called("evaluate")[-1][1][1][0][0] is None and OWN[0][0] is not None
    assert url(at)["plan"].startswith("full.")
