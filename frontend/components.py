"""Widgets shared by pages: URL-bound state, the share/save/export bar, metric badges, figure display."""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import plotly.graph_objects as go
import streamlit as st

from frontend import api, badges, export, figures, plans, url_state, user_text

logger = logging.getLogger(__name__)
PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


# -- URL-bound page state -----------------------------------------------------------------------------


def key(page: str, name: str) -> str:
    return f"{page}.{name}"


def bind_state(page: str) -> dict[str, Any]:
    """Seed the page's widget keys from the URL (first render in this session) or the defaults,
    and return the current state. Widgets then use `key(page, name)` as their key.

    What a link held that could not be used is said in a warning at this point of the page
    (`link_ignored`), never silently replaced by a default."""
    params = {k: st.query_params[k] for k in st.query_params}
    from_url, ignored = url_state.decode_state_checked(page, params)
    seeded = st.session_state.setdefault("_seeded_pages", set())
    if page not in seeded:
        st.session_state[f"_link.{page}.ignored"] = ignored
        # fields the link set: ensure_option / link_ignored say so when one is not valid for this page
        st.session_state[f"_link.{page}.fields"] = set(params) & set(from_url)
    for name, value in from_url.items():
        if page not in seeded or key(page, name) not in st.session_state:
            st.session_state[key(page, name)] = value
    seeded.add(page)
    st.session_state[f"_link.{page}.slot"] = st.empty()
    _show_ignored(page)
    return current_state(page)


def _show_ignored(page: str) -> None:
    ignored = st.session_state.get(f"_link.{page}.ignored")
    slot = st.session_state.get(f"_link.{page}.slot")
    if ignored and slot is not None:
        slot.warning("Ignored from the link: " + "; ".join(ignored) + ". Everything else in it is shown.",
                     icon="⚠️")


def link_ignored(page: str, name: str, problems: Sequence[str]) -> None:
    """Report `problems` with the link's field `name` (once, and only if the link set that field)."""
    fields = st.session_state.get(f"_link.{page}.fields", set())
    if name in fields:
        fields.discard(name)
        if problems:
            st.session_state[f"_link.{page}.ignored"] = [*st.session_state[f"_link.{page}.ignored"], *problems]
            _show_ignored(page)


def current_state(page: str) -> dict[str, Any]:
    return {name: st.session_state.get(key(page, name), d) for name, d in url_state.defaults(page).items()}


def ensure_option(page: str, name: str, options: Sequence[Any], what: str = "not one of the choices",
                  label: Callable[[Any], str] = str) -> None:
    """Make the bound value one of `options`; a value from the link that is not is reported
    ("run=99999 (no such run; showing #11)") and falls back to the first option."""
    k = key(page, name)
    value = st.session_state.get(k)
    bad = bool(options) and value not in options
    link_ignored(page, name, [f"{name}={value} ({what}; showing {label(options[0])})"] if bad else [])
    if bad:
        st.session_state[k] = options[0]


def ensure_range(page: str, name: str, lo: float, hi: float) -> None:
    """Make the bound number (or [low, high] pair) lie within lo..hi; a link's value that does not is
    reported and replaced by the field's default."""
    k, default = key(page, name), url_state.defaults(page)[name]
    value = st.session_state.get(k, default)
    pair = isinstance(default, list)
    ok = (isinstance(value, (list, tuple)) and len(value) == 2 and lo <= value[0] <= value[1] <= hi) if pair \
        else isinstance(value, (int, float)) and lo <= value <= hi
    link_ignored(page, name, [] if ok else [f"{name}={value} (not within {lo:g}..{hi:g}; showing {default})"])
    st.session_state[k] = (tuple(value) if pair else value) if ok else (tuple(default) if pair else default)


def keep_known(page: str, name: str, known: Sequence[Any], what: str) -> list:
    """The bound list without the items not in `known`; those the link gave are reported."""
    values = st.session_state.get(key(page, name)) or []
    unknown = [v for v in values if v not in known]
    link_ignored(page, name, [f"{name}: {', '.join(map(str, unknown))} ({what})"] if unknown else [])
    return [v for v in values if v in known]


def publish(page: str, state: dict[str, Any] | None = None) -> None:
    """Write the page's state to the URL so the address bar is always a link to this view.

    Sent when it differs from the URL this run was asked with, or from the last one this session sent
    for the page: a run's URL is the browser's when the request left, and a URL sent by the run before
    may still be on its way. (Quick edits a, b: the run for b was asked with the URL before a's, which
    already said b, so b was not sent, and a's URL arrived after it: the address bar said a.)"""
    encoded = url_state.encode_state(page, state if state is not None else current_state(page))
    sent = f"_published.{page}"
    if {k: st.query_params[k] for k in st.query_params} != encoded or st.session_state.get(sent) != encoded:
        st.query_params.from_dict(encoded)
        st.session_state[sent] = encoded


def app_base_url() -> str:
    """The dashboard's own address, without the page path and query."""
    url = ""
    try:
        url = st.context.url or ""
    except Exception:  # older runtimes or tests without a browser context
        url = ""
    url = url.split("?", 1)[0]
    m = re.match(r"^(https?://[^/]+)(/.*)?$", url)
    if not m:
        return "http://127.0.0.1:8501"
    path = (m.group(2) or "").rstrip("/")
    path = path.rsplit("/", 1)[0] if path.rsplit("/", 1)[-1] in url_state.PAGE_STATE else path
    return m.group(1) + path


# -- display helpers ----------------------------------------------------------------------------------

# Reports (a one-time trigger) on the first animation frame where no element of the page is still
# waiting for its code (no Suspense skeleton left), or after FIRST_PAINT_WAIT_MS at the latest. In the
# same frame it starts loading Streamlit's Plotly chunk (data.chunk), so the browser evaluates that
# code while the charts' rerun is on its way instead of after it arrives (bench/ui.py: every chart drawn).
FIRST_PAINT_WAIT_MS = 5000
_FIRST_PAINT = st.components.v2.component("aah_first_paint", js="""
export default function ({ data, setTriggerValue }) {
  const start = performance.now();
  const tick = () => {
    const waiting = document.querySelector('[data-testid="stSkeleton"]');
    if (waiting && performance.now() - start < %d) return requestAnimationFrame(tick);
    requestAnimationFrame(() => { setTriggerValue("shown", true); load(data && data.chunk); });
  };
  requestAnimationFrame(tick);
}
// the chunk sits beside Streamlit's entry script: resolving against it keeps any server base path
function load(chunk) {
  const entry = document.querySelector('script[type="module"][src*="/static/js/index."]');
  if (chunk && entry) import(new URL(chunk, entry.src).href).catch(() => {});
}
""" % FIRST_PAINT_WAIT_MS)


def _plotly_chunk() -> str | None:
    """The file name of the installed Streamlit's Plotly chart code (4.7 MB, the largest chunk it loads
    on demand), or None when this Streamlit names its files otherwise: then nothing is loaded early."""
    found = list((Path(st.__file__).parent / "static" / "static" / "js").glob("PlotlyChart.*.js"))
    return found[0].name if len(found) == 1 else None


PLOTLY_CHUNK = _plotly_chunk()


def _shown(page: str) -> None:
    st.session_state[f"_painted.{page}"] = True


def first_paint_done(page: str) -> bool:
    """Whether the browser has shown this page once in this session. Until it has, the caller leaves
    its charts out and this call mounts a script that reports the first paint; the fragment this is
    called in then reruns with them. So a new session sees the numbers before the browser loads and
    draws Plotly (4.7 MB of code, seconds of the browser's time on a busy box: bench/ui.py). Call it
    in a fragment that holds only the charts: the paint's rerun is of them alone."""
    if st.session_state.get(f"_painted.{page}"):
        return True
    _FIRST_PAINT(key=f"_painted.{page}.signal", data={"chunk": PLOTLY_CHUNK},
                 on_shown_change=functools.partial(_shown, page))
    return False


def show_figure(fig: go.Figure, name: str, **kwargs: Any) -> Any:
    """st.plotly_chart with exact colours (theme=None) and a stable key."""
    return st.plotly_chart(fig, key=name, theme=None, config=PLOTLY_CONFIG, **kwargs)


def clicked_points(event: dict | None) -> list[dict]:
    """The points of a chart's selection event (st.plotly_chart on_select), [] when none."""
    return ((event or {}).get("selection") or {}).get("points") or []


def picked_head(event: dict | None) -> tuple[int, int] | None:
    """(layer, head) of the first cell clicked in a window grid's selection event (x: head, y: layer)."""
    points = clicked_points(event)
    return (int(points[0]["y"]), int(points[0]["x"])) if points else None


def _pick_head(page: str, name: str) -> None:
    picked = picked_head(st.session_state.get(name))
    if picked is not None:
        st.session_state[key(page, "layer")], st.session_state[key(page, "head")] = picked


def head_grid(fig: go.Figure, page: str, name: str) -> None:
    """A window grid (figures.window_grid_figure(..., clickable=True)) whose clicked cell becomes the
    page's layer and head."""
    click_figure(fig, name, functools.partial(_pick_head, page, name))


def click_figure(fig: go.Figure, name: str, on_click: Callable[[], None]) -> None:
    """A figure whose clicked points call `on_click` (read them with clicked_points(st.session_state[name]))."""
    show_figure(fig, name, on_select=on_click, selection_mode="points")


def metric_badges(result: dict, kv_note: str | None = None) -> None:
    """Loss, Δloss (nats and %), perplexity and the coverage metrics of one evaluation; `kv_note` (why
    the KV cache did not shrink, figures.kv_group_note) under the cost line."""
    pct = result["delta_pct"]
    badges.show([
        badges.Badge("loss (nats)", f"{result['loss']:.4f}", help="mean next-token loss on the eval batch"),
        badges.Badge("Δloss vs own plan", f"{result['delta']:+.4f}", f"{pct:+.2f} %" if abs(pct) >= 0.005 else None,
                     lower_is_better=True),
        badges.Badge("perplexity", f"{result['perplexity']:.3f}"),
        badges.Badge("acr", f"{result['acr']:.3f}", help="mean over heads of min(w, T) / T (the paper's ACR)"),
        badges.Badge("causal_coverage", f"{result['causal_coverage']:.3f}",
                     help="attended (query, key) pairs / full causal pairs"),
    ])
    st.markdown(f"**{figures.cost_summary(result)}** · at context {result['context']} (exact; one sequence)")
    if kv_note:
        st.caption(kv_note)
    cached = " (served from cache)" if result.get("cached") else ""
    plan = plans.encode_plan(result["windows"]) if result.get("windows") else "?"
    st.caption(f"server time {result.get('elapsed_ms', float('nan')):.0f} ms{cached} · "
               f"eval set {result.get('eval_set', '?')} · tile_coverage {result.get('tile_coverage', float('nan')):.3f}"
               f" · evaluated plan {plan}")


def placeholder(text: str) -> None:
    st.info(text, icon="ℹ️")


def last_plan_result(state: str, model_id: str, plan: list, button: str, action: str) -> dict | None:
    """A panel's last result (st.session_state[state], with its "model" and encoded "plan") for this model, or
    None after a line saying to press `button` to `action`; a caption says when the plan has changed since."""
    res = st.session_state.get(state)
    if not res or res["model"] != model_id:
        placeholder(f"Press {button} to {action}.")
        return None
    if res["plan"] != plans.encode_plan(plan):
        st.caption(f"Computed under the plan {res['plan']}; the plan has changed since: press {button} again.")
    return res


def unavailable_models_note(where: Any = st) -> None:
    """Under a model picker: how many registered models the API could not open, and each one's reason
    (GET /models/unavailable); nothing when every model opened."""
    gone = api.cached("unavailable_models")
    if not gone:
        return
    where.caption(f"{len(gone)} model{'' if len(gone) == 1 else 's'} could not be opened")
    with where.expander("Which, and why"):
        for m in gone:
            st.text(f"{m['name']} ({m['id']}): {m['reason']}")  # plain text: paths and reasons are not markdown


# -- share, save, export --------------------------------------------------------------------------------


def lazy_expander(label: str, key: str) -> Any:
    """A closed expander whose content is built only while it is open (opening it reruns the page, or
    the fragment it is in). Use `with lazy_expander(...) as box: if box.open: ...`: a closed one sends
    no content, so the browser loads no code for it (a page opens faster; bench/ui.py)."""
    return st.expander(label, expanded=False, key=key, on_change="rerun")


def share_bar(page: str, state: dict[str, Any], section: Callable[[], export.Section] | None) -> None:
    """Copy-link, save-as-view and export controls for the current view, built while they are open
    (the link box alone loads the browser's syntax highlighter, about 1.5 MB of code)."""
    with lazy_expander("Share · save · export", f"{page}._share") as bar:
        if not bar.open:
            return
        link = url_state.share_url(app_base_url(), page, state)
        st.caption("Link to exactly this view (copy with the icon at the right):")
        st.code(link, language=None)
        c1, c2 = st.columns([3, 1])
        name = c1.text_input("View name", key=f"{page}._viewname", placeholder="e.g. layer 2 all at 16")
        if c2.button("Save view", key=f"{page}._saveview", disabled=not name.strip()):
            with api.guard("saving the view"):
                view = api.call("create_view", name.strip(), page, url_state.encode_state(page, state))
                saved = user_text.md(view["name"])
                st.success(f"Saved view #{view['id']} “{saved}”; step through saved views on Present.")
        if section is None:
            return
        if st.button("Prepare offline HTML", key=f"{page}._html"):
            with api.guard("exporting"), st.spinner("Building a self-contained HTML file..."):
                sec = section()
                st.session_state[f"{page}._htmldoc"] = export.html_document(sec.title, [sec], source=link)
        doc = st.session_state.get(f"{page}._htmldoc")
        if doc:
            st.download_button("Download HTML (plotly.js inlined, opens offline)", doc, file_name=f"aah-{page}.html",
                               mime="text/html", key=f"{page}._htmldl")
        image_export(page, section)


def image_export(page: str, section: Callable[[], export.Section]) -> None:
    ok, reason = export.image_export_status()
    if not ok:
        st.caption(f"PNG/SVG export is not available here: {reason}. The HTML export works offline, and "
                   "each chart's camera icon saves a PNG from the browser.")
        return
    c1, c2, c3 = st.columns([2, 1, 1])
    fmt = c2.selectbox("Format", ["png", "svg"], key=f"{page}._imgfmt")
    if c3.button("Render image", key=f"{page}._img"):
        with api.guard("exporting"), st.spinner("Rendering with Kaleido (local Chromium)..."):
            sec = section()
            images = {}
            for name, fig in sec.figures.items():
                try:
                    images[name] = export.figure_image(fig, fmt)
                except export.ExportUnavailable as exc:
                    st.warning(str(exc))
                    break
            st.session_state[f"{page}._images"] = (fmt, images)
    fmt_done, images = st.session_state.get(f"{page}._images", (fmt, {}))
    for name, data in images.items():
        c1.download_button(f"{user_text.md(name)}.{fmt_done}", data, file_name=f"aah-{page}-{name}.{fmt_done}",
                           key=f"{page}._imgdl.{name}")
