"""Seeds as groups in the dashboard (AppTest, fake API): the Runs page's filters, grouped table, param table
and notes editor; the ACR page's default run and group band; Compare's groups and reproduction views."""

import statistics

import pytest

from frontend import group_figures, groups
from tests.frontend.test_pages import page, url


def test_runs_page_filters_by_source_group_and_tag(fake_api):
    at = page("runs", source="suite", group="full_adaptive", tag="gpu")
    filtered = [c[2] for c in fake_api.called("runs") if c[2].get("source")]
    assert filtered and all(c["group"] == "full_adaptive" and c["tag"] == "gpu" for c in filtered)
    assert url(at) == {"source": "suite", "group": "full_adaptive", "tag": "gpu"} and not at.exception


def test_runs_page_groups_seeds_with_mean_and_std(fake_api):
    at = page("runs", bygroup="1", metric="val_loss")
    (_, _, kwargs), = fake_api.called("run_groups")
    assert kwargs["keys"] == ["val_loss"]
    df = at.dataframe[0].value
    assert list(df["experiment"]) == ["demo"]  # the paper's Table 1 + Table 2 are not seeds: not a group here
    row = df[df["group"] == "full_adaptive"].iloc[0]
    assert row["runs"] == 2 and row["seeds"] == "0, 1"
    assert row["val_loss mean"] == pytest.approx(statistics.fmean([2.3, 2.5]))
    assert row["val_loss std"] == pytest.approx(statistics.stdev([2.3, 2.5]))
    assert not at.exception and not at.error


def test_runs_page_shows_every_param_and_saves_description_notes_and_tags(fake_api):
    at = page("runs")
    at.multiselect(key="runs._chosen").select(1).run()
    params = next(d.value for d in at.dataframe if list(d.value.columns) == ["param", "value"])
    assert list(params["param"]) == sorted(fake_api.runs_store[0]["params"])
    at.text_input[[t.label for t in at.text_input].index("Description")].input("seed 0")
    at.text_input[[t.label for t in at.text_input].index("Tags (comma-separated)")].input("keep, best ,keep")
    at.button[[b.key for b in at.button].index("FormSubmitter:runs._edit.1-Save")].click().run()
    (_, args, kwargs), = fake_api.called("update_run")
    assert args == (1,) and kwargs == {"description": "seed 0", "notes": None, "tags": ["keep", "best"]}
    assert not at.exception


def test_runs_table_refreshes_itself_only_while_jobs_run(fake_api):
    at = page("runs")
    assert any("Refreshing every 3 s" in c.value for c in at.caption)  # run 2 is RUNNING
    fake_api.runs_store[1]["status"] = "FINISHED"
    at = page("runs")
    assert not any("Refreshing" in c.value for c in at.caption)


def test_acr_default_run_is_one_whose_windows_change_and_its_group_band(fake_api):
    fake_api.runs_store.insert(0, fake_api._run(9, "static", "FINISHED", {"controller.mode": "static"}, 2.0, 1.0))
    at = page("acr")
    assert at.session_state["acr.run"] == 1  # not the newest (static) run: the adaptive one
    at.selectbox(key="acr.band").select("std").run()
    ((_, args, kwargs),) = fake_api.called("group_series")
    assert args == ("demo", "full_adaptive") and kwargs["keys"] == ["val_loss", "train_loss"]
    assert url(at)["band"] == "std" and not at.exception and not at.error


def test_compare_groups_mode_draws_bands_and_the_table(fake_api):
    at = page("compare", mode="groups", keys="val_loss")
    assert at.session_state["compare.groups"] == ["demo::full_adaptive"]  # the paper's group is not offered
    assert fake_api.called("group_series")[0][1] == ("demo", "full_adaptive")
    cell = at.dataframe[0].value.iloc[0]["val_loss"]
    assert cell == groups.pm({"n": 2, "mean": statistics.fmean([2.3, 2.5]), "std": statistics.stdev([2.3, 2.5])})
    assert not at.exception and not at.error


def test_compare_reproduction_view_puts_ours_beside_the_papers_table_1(fake_api):
    at = page("compare", mode="reproduction")
    assert at.session_state["compare.suite"] == "demo"
    # these runs logged no val_text_loss, the view's default: it draws their val_loss and says so
    assert at.session_state["compare.rkey"] == "val_text_loss"
    assert "These runs logged no val_text_loss: drawn is final val_loss (text and copy averaged, where trained with " \
           "the copy task)." in [i.value for i in at.info]
    from frontend import views  # a saved view of it (Present, the deck) is titled by what it draws, too

    section = views.build_section("compare", {"mode": "reproduction", "suite": "demo"})
    assert section.title.startswith("Reproduction: final val_loss (text and copy averaged")
    table = at.dataframe[0].value
    row = table[table["row"] == "full_adaptive"].iloc[0]
    assert row["paper (reported)"] == "3.1000" and row["ours (mean ± std)"].startswith("2.4000 ± 0.1414")
    assert not at.exception and not at.error


def test_band_edges_and_reproduction_rows_are_exact():
    curve = {"step": [0, 1], "mean": [1.0, 2.0], "std": [0.5, None], "min": [0.2, 2.0], "max": [1.9, 2.0]}
    assert group_figures.band_edges(curve, "std") == ([0.5, None], [1.5, None])  # one run at step 1: no band
    assert group_figures.band_edges(curve, "minmax") == ([0.2, 2.0], [1.9, 2.0])
    runs = [{"group": g, "seed": s, "summary": {"val_loss": v}} for g, s, v in
            [("baseline", 0, 2.0), ("baseline", 1, 2.2), ("x", 0, 1.9), ("x", 1, 2.0), ("x", 2, 1.0)]]
    assert groups.paired_deltas(runs) == {"x": [pytest.approx(-0.1), pytest.approx(-0.2)]}  # seed 2 has no baseline
    paper = [{"group": "baseline", "params": {"table": "Table 1 (t)"}, "summary": {"val_loss": 6.5}},
             {"group": "x", "params": {"table": "Table 1 (t)"}, "summary": {"val_loss": 6.4}},
             {"group": "x", "params": {"table": "Table 2 (i)"}, "summary": {"val_loss": 9.0}}]
    ours, theirs = groups.reproduction_rows([], runs, paper, "delta")
    assert ours[0]["row"] == "x" and ours[0]["mean"] == pytest.approx(-0.15) and ours[0]["n"] == 2
    assert theirs == [{"row": "x", "mean": pytest.approx(-0.1), "std": None, "n": 1}]  # Table 2 is left out


def test_a_saved_acr_view_with_a_band_draws_the_band_on_its_slide_and_in_the_deck(fake_api):
    """Issue 23: a saved ACR view lost its group band, and the deck drew Streamlit's placeholder colours."""
    import json

    from frontend import export, views

    at = page("acr", run="1", band="std", smooth="0.3")
    page_fig = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("acr._group")).proto.spec)
    state = {"run": 1, "keys": ["val_loss", "train_loss"], "smooth": 0.3, "step": -1, "band": "std"}
    sec = views.build_section("acr", state)
    assert "group" in sec.figures
    slide = sec.figures["group"].to_plotly_json()
    assert [t.get("line", {}).get("color") for t in slide["data"]] == [
        t.get("line", {}).get("color") for t in page_fig["data"]]
    assert [t.get("fillcolor") for t in slide["data"]] == [t.get("fillcolor") for t in page_fig["data"]]
    fake_api.create_view("band", "acr", {"run": "1", "band": "std", "smooth": "0.3"})
    at = page("present")
    assert any(c.proto.id.endswith(".group") for c in at.get("plotly_chart")) and not at.exception
    doc = export.html_document("deck", [sec], slides=True)
    assert "#000001" not in doc and all(str(c) in doc for c in group_figures.PALETTE[:2])
