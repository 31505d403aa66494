"""The editor's Generate panel: a prompt's continuation under the edited plan beside the model's own
plan's (greedy, so the two differ only by the plans), and the KV cache of each as it grows."""

from __future__ import annotations

import streamlit as st

from frontend import api, components, figures, plans

STATE = "editor._generated"
DEFAULT_PROMPT = "The quick brown fox"
MAX_PROMPT_CHARS = 4096


def growth(resp: dict) -> tuple[list[int], list[int]]:
    """(context, cache bytes) when each new token was predicted, from a /generate answer."""
    start = resp["prompt_tokens"]
    return list(range(start, start + len(resp["cache_bytes"]))), list(resp["cache_bytes"])


def full_growth(resp: dict) -> tuple[list[int], list[int]]:
    """The full plan's cache over the same contexts: it grows by the same bytes every position."""
    positions, _ = growth(resp)
    last = positions[-1] if positions else resp["prompt_tokens"]
    per_position = resp["kv_bytes_full"] // last
    return positions, [c * per_position for c in positions]


def _run(model_id: str, prompt: str, plan: list, n: int) -> None:
    with api.guard("generating"), st.spinner("Generating under both plans..."):
        edited = api.call("generate", model_id, prompt, windows=plan, max_new_tokens=n)
        own = api.call("generate", model_id, prompt, windows=None, max_new_tokens=n)
        st.session_state[STATE] = {"model": model_id, "plan": plans.encode_plan(plan), "prompt": prompt,
                                   "edited": edited, "own": own}


def _column(col: st.delta_generator.DeltaGenerator, title: str, prompt: str, resp: dict) -> None:
    col.markdown(f"**{title}**")
    col.text(prompt + resp["text"])
    why = "max new tokens" if resp["stop_reason"] == "max_new_tokens" else "the model's context"
    col.caption(f"{len(resp['tokens'])} tokens, stopped at {why} · KV cache {resp['cache_bytes'][-1]:,} bytes "
                f"at the end (full plan: {resp['kv_bytes_full']:,}) · {resp['elapsed_ms']:.0f} ms")


def generate_panel(model: dict, plan: list) -> None:
    """Prompt, length and a button; the last result stays until the next press. Built while open."""
    with components.lazy_expander("Generate: the edited plan's continuation beside the model's own plan's",
                                  "editor._gen_open") as box:
        if not box.open:
            return
        prompt = st.text_area("Prompt", DEFAULT_PROMPT, max_chars=MAX_PROMPT_CHARS, key="editor._gen_prompt")
        top = max(1, min(256, model["seq_len"] - 1))
        n = st.slider("New tokens", 1, top, min(64, top), key="editor._gen_n")
        if st.button("Generate", key="editor._gen_btn", help="greedy decoding with per-head KV caches"):
            _run(model["id"], prompt, plan, n)
        res = components.last_plan_result(STATE, model["id"], plan, "Generate",
                                          "continue the prompt under the edited plan and under the model's own")
        if res is None:
            return
        left, right = st.columns(2)
        _column(left, "edited plan", res["prompt"], res["edited"])
        _column(right, "model's own plan", res["prompt"], res["own"])
        fig = figures.cache_growth_figure({"edited plan": growth(res["edited"]), "model's own plan": growth(res["own"])},
                                          full=full_growth(res["edited"]))
        components.show_figure(fig, "editor._cachegrowth")
