"""Streamlit panels for groups of seeds on the Compare page: groups drawn as mean with a band, and the
reproduction view (our suite's rows with error bars beside the paper's reported Table 1)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from frontend import api, components, group_figures, group_views, groups, study, study_panels, study_views


def groups_panel(page: str, runs: list[dict]) -> None:
    """Pick groups (any experiment but the paper's reference), metrics and a band; table and curves."""
    rows = [g for g in api.call("run_groups") if "paper" not in g["sources"]]
    if not rows:
        components.placeholder("No run in the store carries a group yet. Suite runs (`aah suite`) and tracked runs with "
                               "a group do; the shipped reproduction is one.")
        return
    order = groups.row_order([g["group"] for g in rows])
    rows.sort(key=lambda g: (g["experiment"], order.index(g["group"])))  # suite rows in the paper's order
    by_key = {groups.group_key(g): g for g in rows}
    k = components.key(page, "groups")
    st.session_state[k] = components.keep_known(page, "groups", list(by_key), "no such group") or list(by_key)[:3]
    st.multiselect("Groups (seeds of one setting)", list(by_key), format_func=lambda x: groups.group_label(by_key[x]), key=k)
    keys = sorted({key for g in rows for key, s in g["stats"].items() if s and not key.startswith("window_frac/")})
    kk = components.key(page, "keys")
    st.session_state[kk] = [m for m in st.session_state[kk] if m in keys] or keys[:1]
    c1, c2 = st.columns([3, 1])
    c1.multiselect("Metrics", keys, key=kk)
    components.ensure_option(page, "band", list(group_figures.BANDS))
    band = c2.selectbox("Band", list(group_figures.BANDS), format_func=group_figures.BANDS.get, key=components.key(page, "band"))
    chosen = [by_key[x] for x in st.session_state[k]]
    if not chosen:
        components.placeholder("Pick at least one group.")
        return
    metrics = st.session_state[kk]
    st.caption("Each number: mean ± sample std (ddof 1) over the group's runs of each run's last value; curves: "
               "at each step, every run's last value at or before it (the span all runs cover).")
    st.dataframe(pd.DataFrame([{"group": groups.group_label(g), **{m: groups.pm(g["stats"].get(m)) for m in metrics}}
                               for g in chosen]), hide_index=True)
    figs = group_views.group_curve_figures(chosen, metrics, band, {r["id"]: r for r in runs})
    cols = st.columns(2)
    for i, (name, fig) in enumerate(figs.items()):
        with cols[i % 2]:
            components.show_figure(fig, f"{page}._group.{name}")
    retrieval = study.retrieval_rows([{**g, "group": groups.group_label(g)} for g in chosen])
    if retrieval:  # groups that logged passkey retrieval: accuracy by distance, mean ± std over seeds
        if note := study.unlearned_note(retrieval, study_views.RETRIEVAL_CHANCE):
            st.warning(note)
        components.show_figure(group_figures.retrieval_figure(retrieval, study_views.RETRIEVAL_CHANCE,
                                                              title="passkey retrieval by distance · chosen groups"),
                               f"{page}._group_retrieval")


def reproduction_panel(page: str) -> None:
    """Our suite's rows (mean ± std over seeds) beside the paper's Table 1, one metric at a time, on the corpus
    chosen; then the study: retrieval by distance, the matched-coverage comparisons, the corpora, the lr sweep."""
    suites = study_views.suites()
    if not suites:
        components.placeholder("No suite runs in the store: run `aah suite paper --scale mini --seeds 3 --pack FILE` "
                               "and start the API with AAH_SUITE_FILES='[\"FILE\"]' (the shipped reproductions are "
                               "seeded by default).")
        return
    c1, c2, c3 = st.columns([2, 1, 2])
    components.ensure_option(page, "suite", list(suites), "no such suite experiment")
    suite = c1.selectbox("Our suite", list(suites), key=components.key(page, "suite"))
    corpora = suites[suite]
    components.ensure_option(page, "corpus", list(corpora), "no such corpus in this suite")
    corpus = c2.radio("Corpus", list(corpora), key=components.key(page, "corpus"), horizontal=True,
                      help="code: Python source (the bundled default corpus) · english: prose (the Python docs)")
    experiment = corpora[corpus]
    components.ensure_option(page, "rkey", list(groups.REPRO_KEYS))
    key = c3.selectbox("Metric", list(groups.REPRO_KEYS), format_func=groups.REPRO_KEYS.get, key=components.key(page, "rkey"))
    data = group_views.reproduction(experiment, key)
    if data["key"] != key:
        st.info(f"These runs logged no {key}: drawn is {groups.REPRO_KEYS[data['key']]}.")
    components.show_figure(data["figure"], f"{page}._repro")
    st.caption("Left: our runs, one point per suite row with ±1 sample std over seeds as error bars. Right: the "
               "paper's reported Table 1 (one seed: no error bar). The two models differ in size, data and length, "
               "so absolute losses are not comparable: read orderings and gaps. "
               + (f"{data['doc']} says how these runs were produced." if data["doc"] else
                  "`aah suite --doc FILE` wrote this suite's report where it was trained."))
    st.dataframe(pd.DataFrame(group_views.reproduction_table(data)), hide_index=True)
    study_panels.study_panel(page, experiment, corpora)
