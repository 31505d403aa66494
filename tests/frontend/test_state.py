"""Pure state logic: plan text, history, bulk edits, URL state round trips, run helpers."""

import pytest

from frontend import state as S

PLAN = [[4, 8, None, 16], [8, None, 4, 4]]


def test_plan_text_round_trip():
    text = S.encode_plan(PLAN)
    assert text == "4.8.f.16_8.f.4.4"
    assert S.decode_plan(text, 2, 4) == PLAN


@pytest.mark.parametrize("bad", ["", "4.x_8", "4.0_8.8", "4.8_8", "4.-1"])
def test_decode_plan_rejects_malformed_or_misshaped(bad):
    assert S.decode_plan(bad, 2, 2) is None


def test_normalize_writes_windows_at_or_beyond_seq_len_as_full():
    assert S.normalize_plan([[32, 64, 8]], seq_len=32) == [[None, None, 8]]


def test_history_undo_redo_reset():
    h = S.PlanHistory(base=PLAN)
    assert not h.push(PLAN)  # no-op edits are not recorded
    p1 = S.set_cell(PLAN, 0, 0, 16)
    assert h.push(p1) and h.current == p1 and h.can_undo and not h.can_redo
    assert h.undo() == PLAN and h.can_redo
    assert h.redo() == p1
    h.undo()
    p2 = S.set_layer(PLAN, 1, None)
    h.push(p2)
    assert not h.can_redo and h.stack == [PLAN, p2]  # a new edit drops the redo branch
    assert h.reset() == PLAN and h.undo() == p2
    assert h.version == 7  # every push, undo, redo and reset


def test_bulk_edits_do_not_mutate_input():
    before = [list(r) for r in PLAN]
    assert S.set_layer(PLAN, 0, 4) == [[4, 4, 4, 4], [8, None, 4, 4]]
    assert S.set_head(PLAN, 1, 16) == [[4, 16, None, 16], [8, 16, 4, 4]]
    assert S.uniform(2, 3, None) == [[None] * 3] * 2
    assert PLAN == before


def test_k_full_per_layer_keeps_the_widest_heads_full():
    assert S.k_full_per_layer(PLAN, 1, 4) == [[4, 4, None, 4], [4, None, 4, 4]]
    assert S.k_full_per_layer(PLAN, 2, 8) == [[8, 8, None, None], [None, None, 8, 8]]
    assert S.k_full_per_layer(PLAN, 0, 4) == [[4] * 4, [4] * 4]


def test_coverage_matches_hand_values():
    # T=4, one head w=2: acr 2/4; pairs = 2*4 - 1 = 7 of 10
    cov = S.coverage([[2]], 4)
    assert cov["acr"] == pytest.approx(0.5) and cov["causal_coverage"] == pytest.approx(0.7)
    assert S.coverage([[None, 4]], 4) == {"acr": 1.0, "causal_coverage": 1.0}


@pytest.mark.parametrize("page", list(S.PAGE_STATE))
def test_url_state_round_trips_for_every_page(page):
    state = S.defaults(page)
    for name, (kind, _) in S.PAGE_STATE[page].items():
        state[name] = {"str": "x_1", "int": 3, "float": 0.25, "bool": True, "ints": [3, 1],
                       "strs": ["val_loss", "acr"]}[kind]
    assert S.decode_state(page, S.encode_state(page, state)) == state


def test_defaults_are_left_out_of_the_url_and_bad_values_fall_back():
    assert S.encode_state("editor", S.defaults("editor")) == {}
    assert S.decode_state("attention", {"layer": "nope", "head": "2"})["layer"] == 0
    assert S.decode_state("attention", {"layer": "nope", "head": "2"})["head"] == 2


def test_share_url():
    url = S.share_url("http://h:8501/", "attention", {"model": "demo", "layer": 1, "head": 0})
    assert url == "http://h:8501/attention?model=demo&layer=1"
    assert S.share_url("http://h:8501", "editor", {"plan": "4.f"}) == "http://h:8501/?plan=4.f"


def test_parse_overrides():
    assert S.parse_overrides("train.max_steps=50\n# c\nmodel.rope = true\nname=x y\n") == {
        "train.max_steps": 50, "model.rope": True, "name": "x y"}
    assert S.parse_overrides('{"a": 1.5}') == {"a": 1.5}
    with pytest.raises(ValueError, match="line 2"):
        S.parse_overrides("a=1\nbroken")


def test_differing_params_and_filters():
    runs = [{"id": 1, "name": "a", "params": {"lr": "1", "seed": "0"}, "summary": {"val_loss": 2.0, "causal_coverage": 0.3}},
            {"id": 2, "name": "b", "params": {"lr": "1", "seed": "1"}, "summary": {"val_loss": 3.0, "causal_coverage": 0.9}}]
    assert S.differing_params(runs) == ["seed"]
    assert [r["id"] for r in S.filter_runs(runs, "b")] == [2]
    assert [r["id"] for r in S.filter_runs(runs, max_loss=2.5)] == [1]
    assert [r["id"] for r in S.filter_runs(runs, coverage_range=(0.5, 1.0))] == [2]


def test_suggest_window():
    assert S.suggest_window([4, 8, None], [0.5, 0.95, 1.0], 0.9) == 8
    assert S.suggest_window([4, 8, None], [0.5, 0.6, 1.0], 0.9) is None


def test_coerce_state_accepts_text_and_typed_values():
    assert S.coerce_state("compare", {"runs": [1, 2], "agg": "max", "paper": "1"})["runs"] == [1, 2]
    assert S.coerce_state("attention", {"layer": "1", "head": 3})["layer"] == 1
    assert S.coerce_state("attention", {"bogus": 1}) == S.defaults("attention")


def test_apply_table_edits():
    assert S.apply_table_edits(PLAN, {0: {"H1": "full"}, "1": {"H3": "16"}}) == [[4, None, None, 16], [8, None, 4, 16]]
