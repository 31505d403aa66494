"""The reproduction view's study (issue 27) on the fake API: a corpus selector, retrieval accuracy by distance per
row, the adaptive rows against the matched-coverage baselines with their intervals, where the ranking changes
between corpora, and the learning-rate sweep's flips. Numbers are derived from the fake runs, never typed in."""

import json
import statistics

import pytest

from aah_core.suite import paired
from frontend import study
from tests.frontend.test_pages import page, url

CODE, ENGLISH, LR = "paper suite · mini scale", "paper suite · mini scale · english", "paper suite · mini scale · lr sensitivity"
MODES = {"baseline": "static", "full_adaptive": "aah", "fixed_window": "static", "sink_window": "static",
         "local_global": "static", "learned_budget": "learned", "shallow_freeze": "aah", "deep_practical_reuse": "aah"}
DISTANCES = (16, 32, 64, 96, 120)
# each row's final causal coverage at seed 0 (seed s adds 0.02 s for the adaptive rows): the baselines are matched
# to full_adaptive's, the other adaptive rows end elsewhere
COVERAGE = {"baseline": 1.0, "full_adaptive": 0.43, "fixed_window": 0.436, "sink_window": 0.436, "local_global": 0.435,
            "learned_budget": 0.27, "shallow_freeze": 0.6, "deep_practical_reuse": 0.52}
# per corpus: each row's text loss at seed 0 (seed s adds 0.01 s times the row's index: paired deltas vary)
LOSS = {"code": {"baseline": 2.00, "full_adaptive": 2.02, "fixed_window": 2.015, "sink_window": 2.03,
                 "local_global": 2.04, "learned_budget": 1.99, "shallow_freeze": 2.005, "deep_practical_reuse": 2.025},
        "english": {"baseline": 2.30, "full_adaptive": 2.28, "fixed_window": 2.31, "sink_window": 2.33,
                    "local_global": 2.34, "learned_budget": 2.27, "shallow_freeze": 2.32, "deep_practical_reuse": 2.29}}


def _retrieval(row: str, seed: int, learned: bool = True) -> dict[str, float]:
    reach = {"baseline": 200, "local_global": 200, "full_adaptive": 70, "learned_budget": 40}.get(row, 40)
    acc = {f"retrieval@{d}": (0.9 if d < reach and learned else 0.02) + 0.01 * seed for d in DISTANCES}
    return {**acc, "retrieval_mean": statistics.fmean(acc.values())}


def _study(fake, learned: bool = True, anchor=lambda corpus, row: None) -> None:
    fake.runs_store[:] = [r for r in fake.runs_store if r["source"] != "suite"]  # this study is the only suite
    rid = 100
    for corpus, experiment in (("code", CODE), ("english", ENGLISH)):
        for i, (row, mode) in enumerate(MODES.items()):
            for seed in range(3):
                rid += 1
                run = fake._run(rid, f"{row} · seed {seed}", "FINISHED",
                                {"controller.mode": mode, "suite.scale": "mini", "suite.corpus": corpus,
                                 "suite.lr_scale": "1", **({"train.retrieval_anchor": anchor(corpus, row)}
                                                           if anchor(corpus, row) else {})},
                                0.0, 0.4, experiment=experiment, source="suite",
                                group=row, seed=seed)
                run["summary"] = {"val_text_loss": LOSS[corpus][row] + 0.01 * seed * i, "val_loss": 3.0,
                                  "causal_coverage": COVERAGE[row] + 0.02 * seed * (mode != "static"),
                                  **_retrieval(row, seed, learned)}
                fake.runs_store.append(run)
    for scale, shift in ((0.5, {"baseline": 0.10, "full_adaptive": 0.05, "fixed_window": 0.10}),
                         (2.0, {"baseline": 0.01, "full_adaptive": 0.01, "fixed_window": 0.01})):
        for row, delta in shift.items():
            rid += 1
            run = fake._run(rid, f"{row} · lr×{scale:g}", "FINISHED",
                            {"controller.mode": MODES[row], "suite.scale": "mini", "suite.corpus": "code",
                             "suite.lr_scale": f"{scale:g}"}, 0.0, 0.4, experiment=LR, source="suite",
                            group=f"{row} · lr×{scale:g}", seed=0)
            run["summary"] = {"val_text_loss": LOSS["code"][row] + delta}
            fake.runs_store.append(run)


def _frame(at, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_reproduction_view_draws_the_study_on_each_corpus(fake_api):
    _study(fake_api)
    at = page("compare", mode="reproduction", suite=CODE)
    assert not at.exception and not at.error
    assert at.radio(key="compare.corpus").options == ["code", "english"]
    assert any("docs/reproduction-mini.md says how these runs were produced" in c.value for c in at.caption)
    # retrieval by distance: one line per row, mean ± std over the three seeds, and chance
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("compare._retrieval")).proto.spec)
    lines = {t["name"].split(" (n=")[0]: t for t in fig["data"] if not t["name"].startswith("chance")}
    assert list(lines) == ["baseline", "full_adaptive", "shallow_freeze", "deep_practical_reuse", "fixed_window",
                           "learned_budget", "local_global", "sink_window"]  # the paper's rows first, in its order
    for row, trace in lines.items():
        per_seed = [_retrieval(row, s) for s in range(3)]
        assert trace["x"] == list(DISTANCES)
        assert trace["y"] == pytest.approx([statistics.fmean(r[f"retrieval@{d}"] for r in per_seed) for d in DISTANCES])
        assert trace["error_y"]["array"] == pytest.approx(
            [statistics.stdev(r[f"retrieval@{d}"] for r in per_seed) for d in DISTANCES])
    assert next(t for t in fig["data"] if t["name"].startswith("chance"))["y"] == [1 / 62, 1 / 62]
    assert not any("No row retrieves above chance" in w.value for w in at.warning)  # these rows learned it
    # the caption says that distance and where the key sits go together in this set
    assert any("short distance plants the key late" in c.value and "--retrieval" in c.value for c in at.caption)
    # the adaptive rows against each matched baseline: paired by seed, the engine's interval, a plain verdict
    table = _frame(at, "against")
    assert list(dict.fromkeys(table["row"])) == ["full_adaptive", "shallow_freeze", "deep_practical_reuse", "learned_budget"]
    assert list(table[table["row"] == "full_adaptive"]["against"]) == ["fixed_window", "sink_window", "local_global"]
    for _, line in table.iterrows():
        i, j = list(MODES).index(line["row"]), list(MODES).index(line["against"])
        d = paired([LOSS["code"][line["row"]] + 0.01 * s * i - LOSS["code"][line["against"]] - 0.01 * s * j
                    for s in range(3)])
        expected = study.verdict({**d, "n": 3, "resolved": not d["within_noise"]}, 4)
        assert line["Δval_text_loss"] == expected
        cov = [statistics.fmean(COVERAGE[r] + 0.02 * s * (MODES[r] != "static") for s in range(3))
               for r in (line["row"], line["against"])]
        assert line["causal_coverage"] == f"{cov[0]:.3f} / {cov[1]:.3f}"  # unequal for all but full_adaptive
        assert ("no difference resolved" in expected) == d["within_noise"]
    # the corpora's rankings and the pairs that swap between them
    ranks = _frame(at, "corpus")
    code_rank = sorted(LOSS["code"], key=lambda r: statistics.fmean(LOSS["code"][r] + 0.01 * s * list(MODES).index(r)
                                                                      for s in range(3)))
    assert ranks.iloc[0]["ranking by mean loss (lowest first)"] == " < ".join(code_rank)
    swaps = [m.value for m in at.markdown if m.value.startswith("**code → english**")]
    assert swaps and "baseline / full_adaptive swap" in swaps[0]
    # the lr sweep: x1 from the code runs at seed 0, a flip at x0.5 (full_adaptive overtakes fixed_window)
    lr = _frame(at, "lr scale")
    assert list(lr["lr scale"]) == ["×0.5", "×1", "×2"]
    assert lr.iloc[1]["baseline"] == f"{LOSS['code']['baseline']:.4f}"
    flips = next(m.value for m in at.markdown if m.value.startswith("**Orderings that flip"))
    assert "×0.5: baseline / full_adaptive; fixed_window / full_adaptive" in flips and "×2" not in flips
    # the corpus selector switches every section to the English experiment
    at.radio(key="compare.corpus").set_value("english").run()
    assert url(at)["corpus"] == "english" and not at.exception
    assert fake_api.called("group_paired")[-1][1][0] == ENGLISH
    assert not any(m.value.startswith("**Orderings that flip") for m in at.markdown)  # the sweep is the code corpus'


def test_the_caption_says_where_the_runs_planted_the_passkey_and_warns_when_they_differ(fake_api):
    _study(fake_api, anchor=lambda corpus, row: "start" if corpus == "code" else ("start" if row == "baseline" else "end"))
    at = page("compare", mode="reproduction", suite=CODE)
    assert not at.exception and not at.warning
    caption = next(c.value for c in at.caption if "passkey" in c.value or "4-character key" in c.value)
    assert "Every distance asks for the same copy from the sequence's start" in caption
    assert "short distance plants the key late" not in caption
    at.radio(key="compare.corpus").set_value("english").run()  # its baseline runs logged the other set
    assert any("two different passkey sets" in w.value for w in at.warning)
    caption = next(c.value for c in at.caption if "4-character key" in c.value)
    assert "short distance plants the key late" in caption and "Every distance asks for the same copy" in caption
    assert study.describe_set("middle") == "These runs logged a passkey set this dashboard does not know ('middle')."


def test_the_reproduction_slide_draws_the_studys_chart_and_states_its_findings(fake_api):
    """A saved reproduction view's slide (and deck) carries the retrieval chart as the page drew it, and the
    page's findings as lines: every adaptive row against every matched baseline, the corpora's swaps, the flips."""
    from frontend import url_state, views

    _study(fake_api)
    link = {"mode": "reproduction", "suite": CODE, "corpus": "code", "rkey": "val_text_loss"}
    at = page("compare", **link)
    drawn = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("compare._retrieval")).proto.spec)
    section = views.build_section("compare", url_state.decode_state("compare", link))
    assert list(section.figures) == ["reproduction", "retrieval"]
    slide = section.figures["retrieval"].to_plotly_json()
    assert [(t["name"], list(t["x"]), list(t["y"]), t.get("line")) for t in slide["data"]] == \
        [(t["name"], t["x"], t["y"], t.get("line")) for t in drawn["data"]]
    table = _frame(at, "against")
    for _, row in table.iterrows():  # the page's verdicts, word for word
        assert f"{row['row']} vs {row['against']}: Δval_text_loss {row['Δval_text_loss']} · " \
               f"Δretrieval_mean {row['Δretrieval_mean']}" in section.lines
    swap = next(line for line in section.lines if line.startswith("code → english: "))
    assert "baseline / full_adaptive swap" in swap
    assert "learning rate, orderings that flip against ×1: ×0.5: baseline / full_adaptive; fixed_window / full_adaptive" \
        in section.lines


def test_compare_draws_retrieval_by_distance_for_the_chosen_groups(fake_api):
    _study(fake_api)
    at = page("compare", mode="groups", groups=f"{CODE}::full_adaptive,{ENGLISH}::full_adaptive", keys="val_loss")
    assert not at.exception and not at.error
    fig = json.loads(next(c for c in at.get("plotly_chart") if c.proto.id.endswith("compare._group_retrieval")).proto.spec)
    lines = [t for t in fig["data"] if not t["name"].startswith("chance")]
    assert [t["name"].split(" (n=")[0] for t in lines] == [f"full_adaptive · {CODE} (3 runs)",
                                                          f"full_adaptive · {ENGLISH} (3 runs)"]
    per_seed = [_retrieval("full_adaptive", s) for s in range(3)]
    for t in lines:
        assert t["y"] == pytest.approx([statistics.fmean(r[f"retrieval@{d}"] for r in per_seed) for d in DISTANCES])


def test_runs_that_never_learned_retrieval_say_so_above_their_chart(fake_api):
    # accuracies 0.02-0.04: one seed's cell may reach chance + 4 standard errors = 1/62 + 0.0315 = 0.0476 by luck
    _study(fake_api, learned=False)
    for at in (page("compare", mode="reproduction", suite=CODE),
               page("compare", mode="groups", groups=f"{CODE}::full_adaptive", keys="val_loss")):
        assert not at.exception
        notes = [w.value for w in at.warning if w.value.startswith("No row retrieves above chance")]
        assert len(notes) == 1 and "at most 0.048" in notes[0]
    assert study.chance_bound(1 / 62) == pytest.approx(1 / 62 + 4 * (1 / 62 * 61 / 62 / 256) ** 0.5)
    rows = [{"row": "a", "mean": [0.02, 0.047]}, {"row": "b", "mean": [None, 0.01]}]
    assert study.unlearned_note(rows, 1 / 62) is not None
    assert study.unlearned_note([*rows, {"row": "c", "mean": [0.048]}], 1 / 62) is None and \
        study.unlearned_note([], 1 / 62) is None


def test_study_logic_rankings_and_lr_table_are_exact():
    assert study.order_changes(["a", "b", "c"], ["b", "a", "c"]) == [("a", "b")]
    assert study.order_changes(["a", "b"], ["a", "b", "x"]) == []
    main = [{"group": "baseline", "seed": 0, "summary": {"v": 2.0}}, {"group": "baseline", "seed": 1, "summary": {"v": 9.0}},
            {"group": "other", "seed": 0, "summary": {"v": 1.0}}]
    swept = [{"group": "baseline · lr×2", "seed": 0, "summary": {"v": 2.5}, "params": {"suite.lr_scale": "2"}}]
    assert study.lr_table(main, swept, "v") == {1.0: {"baseline": 2.0}, 2.0: {"baseline": 2.5}}
    groups = [{"group": "x", "stats": {"retrieval@32": {"n": 2, "mean": 0.5, "std": 0.1},
                                       "retrieval@16": {"n": 2, "mean": 0.9, "std": None}}}]
    assert study.retrieval_rows(groups) == [{"row": "x", "distance": [16, 32], "n": 2, "mean": [0.9, 0.5],
                                             "std": [None, 0.1]}]
