"""The reproduction view's study, as Streamlit sections under the Table 1 comparison (issue 27): retrieval
accuracy by distance per row, the AAH rows against the matched-coverage baselines, where the ranking
changes between corpora, and whether it flips with the learning rate."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from frontend import components, study, study_views


def study_panel(page: str, experiment: str, corpora: dict[str, str]) -> None:
    runs = study_views.suite_runs()
    st.subheader("Passkey retrieval at a distance")
    ret = study_views.retrieval(experiment, runs)
    if ret["rows"]:
        if note := study.unlearned_note(ret["rows"], study_views.RETRIEVAL_CHANCE):
            st.warning(note)
        anchors = study.retrieval_anchors(runs, experiment)
        if len(anchors) > 1:
            st.warning("These runs logged two different passkey sets (the key planted at the sequence's start in some, "
                       "before the end in others): their accuracies are not comparable with each other.")
        components.show_figure(ret["figure"], f"{page}._retrieval")
        st.caption(" ".join(study.describe_set(a) for a in anchors) + " Accuracy per key character, mean ± 1 sample "
                   f"std over seeds; chance is 1/62 = {study_views.RETRIEVAL_CHANCE:.3f}. A head whose window is ≤ d "
                   "cannot see the key from where it is reproduced.")
        st.dataframe(pd.DataFrame(ret["table"]), hide_index=True)
    else:
        components.placeholder("These runs logged no retrieval accuracy (suites trained before it was measured).")
    st.subheader("Against the windows people deploy, at matched coverage")
    m = study_views.matched(experiment, runs)
    if m["table"]:
        st.caption(f"Each adaptive row against {', '.join(m['bases'])}: the difference of {m['loss']} and of "
                   "retrieval_mean (mean accuracy over the distances), paired by seed, mean ± the 95% t half-interval "
                   "over seeds. Negative Δloss and positive Δretrieval favour the row; “no difference resolved”: the "
                   "interval contains 0, these seeds cannot tell the two apart. The baselines are matched to "
                   "full_adaptive's mean causal coverage; every other adaptive row ends where its controller put it "
                   "(causal_coverage: the row's / the baseline's, mean over seeds).")
        st.dataframe(pd.DataFrame(m["table"]), hide_index=True)
    else:
        components.placeholder("This suite has no matched-coverage baseline row (fixed_window, sink_window, "
                               "local_global) beside an adaptive row.")
    if len(corpora) > 1:
        st.subheader("Across corpora")
        c = study_views.corpora(corpora, runs)
        st.dataframe(pd.DataFrame([{"corpus": name, "ranking by mean loss (lowest first)": " < ".join(rank)}
                                   for name, rank in c["rankings"].items()]), hide_index=True)
        for name, pairs in c["changes"].items():
            first = next(iter(c["rankings"]))
            st.markdown(f"**{first} → {name}**: " + ("; ".join(f"{a} / {b} swap" for a, b in pairs) if pairs
                                                     else "the ordering holds: no pair of rows swaps."))
    lr = study_views.lr_sweep(experiment, runs)
    if lr is not None:
        st.subheader("Learning-rate sensitivity (seed 0)")
        st.dataframe(pd.DataFrame(lr["table"]), hide_index=True)
        flips = [f"×{s:g}: " + "; ".join(f"{a} / {b}" for a, b in pairs) for s, pairs in lr["flips"].items() if pairs]
        st.markdown("**Orderings that flip against ×1**: " + (" · ".join(flips) if flips else "none")
                    + f". One seed per point ({lr['loss']}): a flip between rows closer than the seed noise above "
                    "is not evidence of sensitivity.")
