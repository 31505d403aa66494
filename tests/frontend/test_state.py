"""Pure state logic: plan text, history, bulk edits, URL state round trips, run helpers."""

import pytest

from frontend import history, plans, run_table, url_state

PLAN = [[4, 8, None, 16], [8, None, 4, 4]]


def test_plan_text_round_trip():
    text = plans.encode_plan(PLAN)
    assert text == "4.8.full.16_8.full.4.4"
    assert plans.decode_plan(text, 2, 4) == PLAN
    assert plans.decode_plan("4.8.f.16_8.f.4.4", 2, 4) == PLAN  # a link made before "full" still opens


@pytest.mark.parametrize("bad", ["", "4.x_8", "4.0_8.8", "4.8_8", "4.-1"])
def test_decode_plan_rejects_malformed_or_misshaped(bad):
    assert plans.decode_plan(bad, 2, 2) is None


def test_normalize_writes_windows_at_or_beyond_seq_len_as_full():
    assert plans.normalize_plan([[32, 64, 8]], seq_len=32) == [[None, None, 8]]


def test_history_undo_redo_reset():
    h = history.PlanHistory(base=PLAN)
    assert not h.push(PLAN)  # no-op edits are not recorded
    p1 = plans.set_cell(PLAN, 0, 0, 16)
    assert h.push(p1) and h.current == p1 and h.can_undo and not h.can_redo
    assert h.undo() == PLAN and h.can_redo
    assert h.redo() == p1
    h.undo()
    p2 = plans.set_layer(PLAN, 1, None)
    h.push(p2)
    assert not h.can_redo and h.stack == [PLAN, p2]  # a new edit drops the redo branch
    assert h.reset() == PLAN and h.undo() == p2
    assert h.stack == [PLAN, p2, PLAN] and h.pos == 1  # reset is a step of its own, undone here


def test_bulk_edits_do_not_mutate_input():
    before = [list(r) for r in PLAN]
    assert plans.set_layer(PLAN, 0, 4) == [[4, 4, 4, 4], [8, None, 4, 4]]
    assert plans.set_head(PLAN, 1, 16) == [[4, 16, None, 16], [8, 16, 4, 4]]
    assert plans.uniform(2, 3, None) == [[None] * 3] * 2
    assert PLAN == before


def test_k_full_per_layer_keeps_the_widest_heads_full():
    assert plans.k_full_per_layer(PLAN, 1, 4) == [[4, 4, None, 4], [4, None, 4, 4]]
    assert plans.k_full_per_layer(PLAN, 2, 8) == [[8, 8, None, None], [None, None, 8, 8]]
    assert plans.k_full_per_layer(PLAN, 0, 4) == [[4] * 4, [4] * 4]


def test_a_window_label_has_one_spelling_of_full():
    assert [plans.parse_window(x) for x in ("full", None, "16", 16)] == [None, None, 16, 16]
    assert [plans.window_label(w) for w in (None, 16)] == ["full", "16"]
    for other in ("f", "", "null", "none", "FULL", "0", "-3", 2.5, True):
        with pytest.raises(ValueError):
            plans.parse_window(other)


@pytest.mark.parametrize("page", list(url_state.PAGE_STATE))
def test_url_state_round_trips_for_every_page(page):
    state = url_state.defaults(page)
    for name, (kind, _) in url_state.PAGE_STATE[page].items():
        state[name] = {"str": "x_1", "int": 3, "float": 0.25, "bool": True, "ints": [3, 1],
                       "strs": ["val_loss", "acr"], "floats": [0.25, 0.5]}[kind]
    assert url_state.decode_state(page, url_state.encode_state(page, state)) == state


def test_defaults_are_left_out_of_the_url_and_bad_values_fall_back():
    assert url_state.encode_state("editor", url_state.defaults("editor")) == {}
    assert url_state.decode_state("attention", {"layer": "nope", "head": "2"})["layer"] == 0
    assert url_state.decode_state("attention", {"layer": "nope", "head": "2"})["head"] == 2


def test_decode_state_says_what_was_ignored():
    state, ignored = url_state.decode_state_checked("attention", {"layer": "abc", "head": "2", "foo": "1"})
    assert state["layer"] == 0 and state["head"] == 2  # the valid field is kept
    assert ignored == ["layer=abc (not an integer)", "foo=1 (not a setting of this page)"]
    state, ignored = url_state.decode_state_checked("compare", {"runs": "1,x,3", "smooth": "nan", "paper": "maybe"})
    assert state["runs"] == [1, 3] and state["smooth"] == 0.6 and state["paper"] is False
    assert ignored == ["runs: x (not integers)", "smooth=nan (not a number)", "paper=maybe (not on/off)"]
    assert url_state.decode_state_checked("editor", {"plan": "4.f"}) == ({**url_state.defaults("editor"), "plan": "4.f"}, [])


def test_repair_plan_keeps_valid_cells_and_says_what_was_ignored():
    own = [[4, None], [8, 8]]
    assert plans.repair_plan("16.f_4.4", own) == ([[16, None], [4, 4]], [])
    plan, ignored = plans.repair_plan("0.f_x.4", own)
    assert plan == [[4, None], [8, 4]]  # the bad cells keep the model's own windows
    assert len(ignored) == 1 and "L0H0='0'" in ignored[0] and "L1H0='x'" in ignored[0]
    plan, ignored = plans.repair_plan("4.4.4_4.4.4", own)
    assert plan == own and "2 layers × 2 heads" in ignored[0]


def test_share_url():
    url = url_state.share_url("http://h:8501/", "attention", {"model": "demo", "layer": 1, "head": 0})
    assert url == "http://h:8501/attention?model=demo&layer=1"
    assert url_state.share_url("http://h:8501", "editor", {"plan": "4.f"}) == "http://h:8501/?plan=4.f"


def test_parse_overrides():
    assert run_table.parse_overrides("train.max_steps=50\n# c\nmodel.rope = true\nname=x y\n") == {
        "train.max_steps": 50, "model.rope": True, "name": "x y"}
    assert run_table.parse_overrides('{"a": 1.5}') == {"a": 1.5}
    with pytest.raises(ValueError, match="line 2"):
        run_table.parse_overrides("a=1\nbroken")


def test_differing_params_and_filters():
    runs = [{"id": 1, "name": "a", "params": {"lr": "1", "seed": "0"}, "summary": {"val_loss": 2.0, "causal_coverage": 0.3}},
            {"id": 2, "name": "b", "params": {"lr": "1", "seed": "1"}, "summary": {"val_loss": 3.0, "causal_coverage": 0.9}}]
    assert run_table.differing_params(runs) == ["seed"]
    assert [r["id"] for r in run_table.filter_runs(runs, "b")] == [2]
    assert [r["id"] for r in run_table.filter_runs(runs, max_loss=2.5)] == [1]
    assert [r["id"] for r in run_table.filter_runs(runs, coverage_range=(0.5, 1.0))] == [2]


def test_suggest_window():
    assert plans.suggest_window([4, 8, None], [0.5, 0.95, 1.0], 0.9) == 8
    assert plans.suggest_window([4, 8, None], [0.5, 0.6, 1.0], 0.9) is None


def test_coerce_state_accepts_text_and_typed_values():
    assert url_state.coerce_state("compare", {"runs": [1, 2], "agg": "max", "paper": "1"})["runs"] == [1, 2]
    assert url_state.coerce_state("attention", {"layer": "1", "head": 3})["layer"] == 1
    assert url_state.coerce_state("attention", {"bogus": 1}) == url_state.defaults("attention")


def test_apply_table_edits():
    assert plans.apply_table_edits(PLAN, {0: {"H1": "full"}, "1": {"H3": "16"}}) == [[4, None, None, 16], [8, None, 4, 16]]


def test_runs_table_puts_metrics_next_to_the_name_with_fixed_decimals():
    """Issue 23: the default Runs table cut val_loss off at the right, and mixed decimals."""
    from frontend import run_views

    runs = [{"id": 1, "name": "a", "status": "FINISHED", "summary": {"val_loss": 2.5, "acr": 0.12345}},
            {"id": 2, "name": "b", "status": "FINISHED", "summary": {"val_loss": 2.123456, "acr": None}}]
    df = run_views.runs_frame(runs, False)
    assert list(df.columns[:6]) == ["id", "name", "status", "val_loss", "acr", "causal_coverage"]
    assert [run_table.metric_text("val_loss", v) for v in df["val_loss"]] == ["2.5000", "2.1235"]
    assert [run_table.metric_text("acr", v) for v in df["acr"]] == ["0.123", ""]
    assert run_table.metric_text("name", "x") == "x"
