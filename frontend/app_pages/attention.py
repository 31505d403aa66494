"""Attention view: one head's map with its window drawn in, what the window cuts off, and per-head
retained-mass and sensitivity diagnostics."""

import streamlit as st

from frontend import api, attention_figures, attention_panel, cold_open, components, figures, plans, views

PAGE = "attention"
st.title("Attention")
state = components.bind_state(PAGE)


with api.guard("loading the model", stop=True), st.spinner("Loading models and texts..."):
    models = api.cached("models")
    ids = [m["id"] for m in models]
    components.ensure_option(PAGE, "model", ids, "no such model")
    texts = api.cached("model_texts", st.session_state[components.key(PAGE, "model")])
    c1, c2, c3, c4, c5, c6 = st.columns([2, 2, 1, 1, 1, 2])
    model_id = c1.selectbox("Model", ids, key=components.key(PAGE, "model"))
    components.unavailable_models_note(c1)
    model = next(m for m in models if m["id"] == model_id)
    text_ids = [t["id"] for t in texts] + [views.CUSTOM_TEXT]
    components.ensure_option(PAGE, "text", text_ids, "no such text")
    tnames = {t["id"]: f"{t['name']} ({t['kind']}, {t['n_tokens']} tokens)" for t in texts}
    tnames[views.CUSTOM_TEXT] = "Your own text…"
    c2.selectbox("Text", text_ids, format_func=tnames.get, key=components.key(PAGE, "text"))
    components.ensure_option(PAGE, "layer", list(range(model["n_layer"])), f"this model has layers 0-{model['n_layer'] - 1}")
    components.ensure_option(PAGE, "head", list(range(model["n_head"])), f"this model has heads 0-{model['n_head'] - 1}")
    layer = c3.selectbox("Layer", list(range(model["n_layer"])), key=components.key(PAGE, "layer"))
    head = c4.selectbox("Head", list(range(model["n_head"])), key=components.key(PAGE, "head"))
    own = api.cached("model_windows", model_id)["windows"]
    choices = ["own"] + [plans.window_label(b) for b in model.get("buckets") or [] if b is not None] + [plans.FULL]
    components.ensure_option(PAGE, "window", choices, "not one of this model's windows")
    c5.selectbox("Window", choices, key=components.key(PAGE, "window"),
                 format_func=lambda c: f"own ({plans.window_label(own[layer][head])})" if c == "own" else c)
    components.ensure_option(PAGE, "scale", list(attention_figures.SCALES), "not a colour scale")
    c6.selectbox("Colour scale", list(attention_figures.SCALES), format_func=attention_figures.SCALES.get,
                 key=components.key(PAGE, "scale"),
                 help="log and per-row show weak attention that a linear 0..1 scale washes out")
    state = components.current_state(PAGE)
    components.publish(PAGE, state)
    own_text = None
    if state["text"] == views.CUSTOM_TEXT:
        # no max_chars: the browser would drop the rest of a long paste without a word
        own_text = st.text_area(f"Your text (up to {views.OWN_TEXT_MAX_CHARS:,} characters are read; not part "
                                "of shared links)", key="attention._own_text").strip() or None
        if own_text and len(own_text) > views.OWN_TEXT_MAX_CHARS:
            st.warning(f"Your text has {len(own_text):,} characters; only the first {views.OWN_TEXT_MAX_CHARS:,} "
                       "are read.", icon="✂️")
            own_text = own_text[: views.OWN_TEXT_MAX_CHARS]
        if not own_text:
            components.placeholder("Type or paste a text above to see this head's attention on it.")
            st.stop()

    with st.expander("Pick a head on the model's window map", expanded=False):
        components.head_grid(figures.window_grid_figure(own, selected=(layer, head), clickable=True,
                                                             seq_len=model["seq_len"]), PAGE,
                             f"attention._grid.{model_id}")

with api.guard("attention maps"):

    span_slot = st.container()  # what of a long text is shown, and the slider that moves the span
    with st.spinner(f"Computing layer {layer}, head {head} attention..."):
        _, data, _ = views.attention_data(state, own_text, st.session_state.get("attention._offset", 0))
    note = views.span_note(data)
    if note:
        with span_slot:
            st.warning(note, icon="✂️")
            last = data["text_tokens"] - data["n_tokens"]
            st.session_state["attention._offset"] = data["offset"]  # the span the API used (clipped)
            st.slider("Tokens skipped before the span", 0, last, step=1, key="attention._offset",
                      help=f"the {data['n_tokens']} tokens after these are shown")
    scale = state["scale"]
    attention_panel.maps(data, scale)
    attention_panel.multiples(state, model, own_text, data.get("offset", 0), scale)
    attention_panel.query_text(data)

with api.guard("retained-mass curves"):
    if st.toggle("Retained-mass curve for this head", key=components.key(PAGE, "rm")):
        with st.spinner("Computing retained mass for every head..."):
            if own_text:  # the pasted text, on the span shown above: the curve and τ are about this text
                rm = api.cached("retained_mass_of_text", model_id, own_text, st.session_state.get("attention._offset", 0))
                st.caption("On your text, the tokens shown above.")
            else:
                rm = api.cached("retained_mass", model_id, text_id=state["text"] or None)
        components.ensure_range(PAGE, "tau", *views.TAU_RANGE)
        tau = st.slider("τ (suggest the smallest window keeping this much mass)", *views.TAU_RANGE, step=0.01,
                        key=components.key(PAGE, "tau"))
        mass = rm["mass"][layer][head]
        components.show_figure(views.retained_figure(rm, own, {**state, "tau": tau}, model["seq_len"]),
                               "attention._retained")
        st.caption(f"Smallest window keeping ≥ {tau:.2f} of the mass: "
                   f"**{plans.window_label(plans.suggest_window(rm['buckets'], mass, tau))}** "
                   f"(assigned: {plans.window_label(own[layer][head])}).")

with api.guard("sensitivity sweep"):
    if st.toggle("Sensitivity sweep (Δloss when one head alone is shrunk)", key=components.key(PAGE, "sens")):
        with st.spinner("Running the sweep on the server (one evaluation per head and window; cached after)..."):
            sens = api.cached("sensitivity", model_id)
        labels = [plans.window_label(b) for b in sens["buckets"]]
        components.ensure_option(PAGE, "bucket", list(range(len(labels))))
        k = st.selectbox("Window for the sweep", list(range(len(labels))), format_func=labels.__getitem__,
                         key=components.key(PAGE, "bucket"))
        components.show_figure(figures.sensitivity_figure(sens["delta"], sens["buckets"], k), "attention._sensfig")
        st.caption(cold_open.pick_line(sens))

components.share_bar(PAGE, components.current_state(PAGE), lambda: views.attention_section(components.current_state(PAGE)))
