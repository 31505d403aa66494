"""The editor's window map, window pills and typed window as one browser-side component (Streamlit
Components v2, no iframe, all code inline).

Why a component: with Streamlit widgets, the map click and the pill click were two widgets and two
reruns, so a pill clicked before the map's rerun returned belonged to the previous head (issue 23:
31 % of quick edits changed a head the user did not pick). Here the browser keeps the selection
itself, so the pills always belong to the head they show, and every edit is one message carrying
(layer, head, window).

No click is lost: the component keeps a log of numbered messages and sends the whole unacknowledged
log with each one. Streamlit keeps only the newest value of a component's state when several arrive
during one rerun, and the newest log still holds every earlier message; the script applies each
number once (`apply_log`) and tells the browser how far it got (`ack`), so the browser drops what
was applied. A page reload is a new session: both sides start from 0."""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

import streamlit as st
from plotly.colors import sample_colorscale

from frontend import history, plans

CELL_PX = 34  # one head's cell; the component's height follows from it, so nothing below it moves

_CSS = """
.he { font-family: var(--st-font, sans-serif); font-size: 14px; color: var(--st-text-color, #31333f); }
.he .cap { font-size: 12px; opacity: .7; height: 18px; margin-bottom: 4px; white-space: nowrap; overflow: hidden; }
.he .grid { display: grid; gap: 2px; align-items: stretch; }
.he .lab { font-size: 12px; display: flex; align-items: center; justify-content: center; opacity: .75; }
.he .cell { border: 2px solid transparent; border-radius: 3px; height: %(cell)dpx; min-width: 0; padding: 0;
            font-size: 12px; cursor: pointer; box-sizing: border-box; }
.he .cell.changed { border-color: #ff2d55; }
.he .cell.sel { outline: 3px solid #000; outline-offset: -1px; }
.he .kv { box-shadow: inset 3px 0 0 #555; }
.he .row2 { display: flex; gap: 12px; align-items: flex-end; margin-top: 8px; height: 64px; }
.he .pills { display: flex; flex-wrap: nowrap; gap: 4px; overflow-x: auto; }
.he .pill { border: 1px solid #bbb; border-radius: 16px; padding: 3px 10px; background: #fff; cursor: pointer;
            font-size: 13px; white-space: nowrap; }
.he .pill[aria-checked="true"] { background: #ff4b4b; border-color: #ff4b4b; color: #fff; }
.he .glabel { font-size: 13px; margin-bottom: 4px; height: 18px; white-space: nowrap; }
.he input { width: 90px; font-size: 14px; padding: 3px 6px; }
""" % {"cell": CELL_PX}

_JS = """
// per mounted instance: next number, unacknowledged log, selection. Kept on the window, not in this
// module: should Streamlit load the module again, a fresh map would restart the numbering at the
// script's ack and a click's new number could repeat one already sent (and be skipped as applied)
const STATE = (globalThis.__aahHeadEditor = globalThis.__aahHeadEditor || new Map());

function label(w) { return w === null ? "full" : String(w); }

export default function ({ data, key, parentElement, setStateValue }) {
  let s = STATE.get(key);
  if (!s) { s = { seq: data.ack, sent: data.ack, log: [], sel: data.sel }; STATE.set(key, s); }
  s.seq = Math.max(s.seq, data.ack);
  s.log = s.log.filter(m => m.seq > data.ack);
  if (data.ack >= s.sent) s.sel = data.sel;  // the script has every message: its selection is current
  s.data = data;

  const send = (msg) => {
    s.seq += 1; s.sent = s.seq;
    s.log.push({ ...msg, seq: s.seq });
    setStateValue("log", { log: s.log.slice() });
    s.draw();
  };
  const shown = () => {  // the script's plan with the edits it has not applied yet
    const plan = s.data.plan.map(r => r.slice());
    for (const m of s.log) if (m.kind === "edit") plan[m.layer][m.head] = m.window;
    return plan;
  };
  s.send = send;  // the listeners below are attached once and call this render's functions

  let root = parentElement.querySelector(".he");
  if (!root) {
    root = document.createElement("div");
    root.className = "he";
    root.innerHTML = '<div class="cap"></div><div class="grid"></div>' +
      '<div class="row2"><div><div class="glabel"></div><div class="pills" role="radiogroup"></div></div>' +
      '<label><div class="glabel typed"></div><input type="number" step="1"></label></div>';
    parentElement.appendChild(root);
    // one listener per container, on nodes that live as long as the map: a redraw (each rerun) updates
    // the cells and pills in place, so a click whose press and release straddle a redraw still lands
    // (replacing the buttons between mousedown and mouseup lost that click: no click event fires)
    root.querySelector(".grid").addEventListener("click", (e) => {
      const b = e.target.closest(".cell");
      if (!b) return;
      s.sel = [Number(b.dataset.l), Number(b.dataset.h)];
      s.send({ kind: "select", layer: s.sel[0], head: s.sel[1] });
    });
    root.querySelector(".pills").addEventListener("click", (e) => {
      const b = e.target.closest(".pill");
      if (!b) return;
      const [l, h] = s.sel;  // the head the pills are shown for: draw() relabels them with every selection
      s.send({ kind: "edit", layer: l, head: h, window: b.dataset.w === "full" ? null : Number(b.dataset.w) });
    });
    root.querySelector("input").addEventListener("change", (e) => {
      const v = parseInt(e.target.value, 10);
      if (!Number.isFinite(v) || v < 1) return;
      const [l, h] = s.sel;
      s.send({ kind: "edit", layer: l, head: h, window: v >= s.data.seq_len ? null : v });
    });
  }

  function draw() {
    const d = s.data, plan = shown(), [sl, sh] = s.sel;
    root.querySelector(".cap").textContent = d.caption;
    const grid = root.querySelector(".grid");
    const shape = `${d.n_layer}x${d.n_head}`;
    if (grid.dataset.shape !== shape) {  // built once per model shape; later draws update the cells
      grid.dataset.shape = shape;
      grid.style.gridTemplateColumns = `32px repeat(${d.n_head}, minmax(0, 1fr))`;
      const parts = ['<div></div>'];
      for (let h = 0; h < d.n_head; h++) parts.push(`<div class="lab">H${h}</div>`);
      for (let l = 0; l < d.n_layer; l++) {
        parts.push(`<div class="lab">L${l}</div>`);
        for (let h = 0; h < d.n_head; h++)
          parts.push(`<button class="cell" data-l="${l}" data-h="${h}" aria-label="layer ${l}, head ${h}"></button>`);
      }
      grid.innerHTML = parts.join("");
    }
    grid.querySelectorAll(".cell").forEach(b => {
      const l = Number(b.dataset.l), h = Number(b.dataset.h), w = plan[l][h], lab = label(w);
      const cls = ["cell"];
      if (w !== d.own[l][h]) cls.push("changed");
      if (l === sl && h === sh) cls.push("sel");
      if (d.group > 1 && h > 0 && h % d.group === 0) cls.push("kv");
      b.className = cls.join(" ");
      b.title = `layer ${l}, head ${h}: window ${lab}`;
      b.style.background = d.colors[lab] || "#888";
      b.style.color = d.ink[lab] || "#000";
      b.textContent = lab;
    });
    const cur = label(plan[sl][sh]);
    const name = `Window of layer ${sl}, head ${sh}`;
    root.querySelector(".glabel").textContent = name;
    const pills = root.querySelector(".pills");
    pills.setAttribute("aria-label", name);
    const labels = d.labels.join("|");
    if (pills.dataset.labels !== labels) {  // rebuilt only when the offered windows change
      pills.dataset.labels = labels;
      pills.innerHTML = d.labels.map(lab => `<button class="pill" role="radio" data-w="${lab}">${lab}</button>`).join("");
    }
    pills.querySelectorAll(".pill").forEach(b => b.setAttribute("aria-checked", String(b.dataset.w === cur)));
    root.querySelector(".typed").textContent = `or type a window (1-${d.seq_len})`;
    const input = root.querySelector("input");
    input.min = 1; input.max = d.seq_len;
    input.setAttribute("aria-label", `Window of layer ${sl}, head ${sh}, typed`);
    if (document.activeElement !== input && parentElement.activeElement !== input)
      input.value = plan[sl][sh] === null ? d.seq_len : plan[sl][sh];
  }
  s.draw = draw;
  draw();
}
"""

# in the page's own DOM (no shadow root; the CSS is scoped under .he), so page scripts such as
# bench/ui.py find the pills as they find any other element
_COMPONENT = st.components.v2.component("aah_head_editor", css=_CSS, js=_JS, isolate_styles=False)


def window_colors(labels: Sequence[str], seq_len: int) -> tuple[dict[str, str], dict[str, str]]:
    """(fill, text colour) of each window label on Viridis, log2 of the window over the model's own
    context (1 .. T), full at the top: a colour means the same share of this model's context."""
    top = max(math.log2(max(seq_len, 2)), 1.0)
    pos = {lab: 1.0 if lab == plans.FULL else min(math.log2(max(int(lab), 1)) / top, 1.0) for lab in labels}
    fills = dict(zip(pos, sample_colorscale("Viridis", list(pos.values()), colortype="rgb")))
    return fills, {lab: "#fff" if p < 0.6 else "#000" for lab, p in pos.items()}


def apply_log(hist: history.PlanHistory, log: Sequence[Mapping[str, Any]], ack: int, seq_len: int,
              n_layer: int, n_head: int) -> tuple[int, tuple[int, int] | None]:
    """Apply the messages numbered above `ack`, in order: an edit sets its own (layer, head), a
    select picks a head. Returns the new ack and the last selection (None when there was none).
    Messages naming a head outside the model are skipped (a stale page of another model)."""
    picked = None
    for msg in sorted(log, key=lambda m: int(m.get("seq", 0))):
        seq, layer, head = int(msg.get("seq", 0)), int(msg.get("layer", -1)), int(msg.get("head", -1))
        if seq <= ack:
            continue
        ack = seq
        if not (0 <= layer < n_layer and 0 <= head < n_head):
            continue
        picked = (layer, head)
        if msg.get("kind") == "edit":
            hist.push(plans.normalize_plan(plans.set_cell(hist.current, layer, head, msg.get("window")), seq_len))
    return ack, picked


def _on_log(hist: history.PlanHistory, key: str, model: dict, layer_key: str, head_key: str,
            on_edit: str | None) -> None:
    log = (st.session_state[key].get("log") or {}).get("log") or []
    before = hist.current
    ack, picked = apply_log(hist, log, st.session_state.get(key + ".ack", 0), model["seq_len"],
                            model["n_layer"], model["n_head"])
    st.session_state[key + ".ack"] = ack
    if picked is not None:
        st.session_state[layer_key], st.session_state[head_key] = picked
    if on_edit is not None and hist.current is not before:
        st.rerun(on_edit)  # the plan changed: rerun the fragment that evaluates it, not only this one


def height(n_layer: int) -> int:
    """The component's fixed height in pixels: caption, header row, one row per layer, pills."""
    return 22 + (CELL_PX + 2) * (n_layer + 1) + 72


def head_editor(model: dict, hist: history.PlanHistory, own: list, labels: list[str], selected: tuple[int, int],
                layer_key: str, head_key: str, kv_group: int = 1, on_edit: str | None = None) -> None:
    """Draw the map, pills and typed window of `model`; edits go into `hist`, a picked head into the
    session keys `layer_key` and `head_key` (the page's URL-bound layer and head). A message reruns the
    fragment this is drawn in; one that changed the plan reruns the fragment keyed `on_edit` instead
    (when given: the caller draws this in a small fragment of its own, so a picked head reruns only it)."""
    key = f"editor._heads.{model['id']}"
    fills, ink = window_colors(labels, model["seq_len"])
    data = {"plan": hist.current, "own": own, "labels": labels, "colors": fills, "ink": ink,
            "seq_len": model["seq_len"], "n_layer": model["n_layer"], "n_head": model["n_head"],
            "sel": list(selected), "ack": st.session_state.get(key + ".ack", 0), "group": kv_group,
            "caption": "Window map: click a cell to pick that head · black: picked · red outline: changed vs own plan"
                       + (f" · grey bar: a KV group of {kv_group} heads" if kv_group > 1 else "")}
    _COMPONENT(key=key, data=data, height=height(model["n_layer"]),
               on_log_change=functools.partial(_on_log, hist, key, model, layer_key, head_key, on_edit))
