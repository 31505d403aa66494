"""Per-page URL state: each page's query parameters as a typed schema, and share links. Pure."""

from __future__ import annotations

from typing import Any, Callable, Mapping
from urllib.parse import urlencode

# Each page's state is a flat dict; these schemas give each field a kind and a default. Defaults are
# left out of the URL, so links stay short and an empty URL means "the defaults".

PAGE_STATE: dict[str, dict[str, tuple[str, Any]]] = {
    "editor": {"model": ("str", ""), "plan": ("str", ""), "eval": ("str", "mixed"),
               "layer": ("int", 0), "head": ("int", 0), "metric": ("str", "causal_coverage"),
               "xaxis": ("str", "coverage"), "runsplot": ("bool", False), "sinks": ("int", -1)},
    "attention": {"model": ("str", ""), "text": ("str", ""), "layer": ("int", 0), "head": ("int", 0),
                  "window": ("str", "own"), "bucket": ("int", 0),
                  "scale": ("str", "linear"), "side": ("bool", False), "query": ("int", -1),
                  "querymap": ("str", "windowed"), "rm": ("bool", True), "tau": ("float", 0.9),
                  "sens": ("bool", False)},
    "runs": {"experiment": ("str", ""), "preset": ("str", ""), "status": ("str", ""), "q": ("str", ""),
             "allparams": ("bool", False), "paper": ("bool", True), "source": ("str", ""), "group": ("str", ""),
             "tag": ("str", ""), "bygroup": ("bool", False), "metric": ("str", "val_loss"),
             "maxloss": ("float", 0.0), "cov": ("floats", [0.0, 1.0])},
    "acr": {"run": ("int", 0), "keys": ("strs", ["val_loss", "train_loss"]), "smooth": ("float", 0.6),
            "step": ("int", -1), "band": ("str", ""), "steps": ("ints", [])},
    "compare": {"runs": ("ints", []), "keys": ("strs", ["val_loss"]), "agg": ("str", "last"),
                "step": ("int", 0), "paper": ("bool", False), "smooth": ("float", 0.6), "mode": ("str", "runs"),
                "groups": ("strs", []), "band": ("str", "std"), "suite": ("str", ""), "corpus": ("str", ""),
                "rkey": ("str", "val_text_loss"), "diffa": ("int", 0), "diffb": ("int", 0)},
    "present": {"deck": ("ints", []), "slide": ("int", 0), "mode": ("str", "")},
}

# The controls of a page that are not part of its view, and why: each acts (a button, or the inputs of
# a form that starts a job), or edits something the view holds in another field. A control that is
# neither in PAGE_STATE nor here fails tests/frontend/test_view_audit.py. Keys: the widget key after
# "<page>.", matched as a name or a name followed by "." (per-run, per-model keys).
_SHARE = {"_share": "the share bar's expander (as the editor's _gen_open)", "_viewname": "the name of a view to save",
          "_saveview": "action",
          "_html": "export action", "_htmldl": "export download", "_imgfmt": "export format", "_img": "export action",
          "_imgdl": "export download"}
NOT_VIEW_STATE: dict[str, dict[str, str]] = {
    "editor": {**_SHARE, "_heads": "the map and pills: their selection is layer/head, their edits the plan",
               "_undo": "edits the plan", "_redo": "edits the plan", "_reset": "edits the plan",
               "_preset": "the inputs of Apply preset, which edits the plan", "_preset_w": "as _preset",
               "_preset_k": "as _preset", "_budget": "as _preset", "_apply": "edits the plan",
               "_bulk_layer": "the inputs of Set layer, which edits the plan", "_bulk_lw": "as _bulk_layer",
               "_set_layer": "edits the plan", "_bulk_head": "the inputs of Set head, which edits the plan",
               "_bulk_hw": "as _bulk_head", "_set_head": "edits the plan", "_table": "edits the plan",
               "_table_open": "the table's expander (as _gen_open)",
               "_load": "loads a rounded plan into the plan", "_curvebtn": "runs the allocator (an action)",
               "_gen_open": "the Generate expander (opening it shows, it changes nothing)",
               "_gen_prompt": "the input of Generate (an action)",
               "_gen_n": "as _gen_prompt", "_gen_btn": "action", "_serving": "the serving-grains expander (as _gen_open)",
               "_ret_open": "the Retrieval expander (as _gen_open)", "_ret_btn": "action"},
    "attention": {**_SHARE, "_own_text": "the user's own text: never put in a link or a saved view",
                  "_offset": "the span of the user's own text (not in links, as the text)",
                  "_grid": "a click sets layer/head", "_multiples": "a click sets head",
                  "_multi": "opts in to computing every head of a large model's layer; a link never starts that"},
    "runs": {**_SHARE, "_chosen": "the runs the Compare and Cancel actions take", "_target": "the launch form",
             "_res": "the launch form", "_preset": "the launch form", "_name": "the launch form",
             "_exp": "the launch form", "_overrides": "the launch form", "_launch": "the launch form", "_cancel": "action"},
    "acr": {**_SHARE, "_metrics": "the chart's drag zoom (the saved range is the Steps slider: steps)"},
    "compare": {**_SHARE},
    "present": {**_SHARE, "_prev": "steps slide", "_next": "steps slide", "_mode": "sets mode",
                "_name": "renames a saved view", "_rename": "renames a saved view", "_up": "reorders saved views",
                "_down": "reorders saved views", "_delete": "deletes a saved view", "_dl": "export download"},
}


_KIND_WORDS = {"int": "an integer", "float": "a number", "ints": "integers", "floats": "numbers", "bool": "on/off"}


def _finite(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(raw)
    return value


def _items(raw: str, convert: Callable[[str], Any]) -> tuple[list, list[str]]:
    """A comma-separated list: (the items `convert` reads, the others)."""
    good, bad = [], []
    for x in (x.strip() for x in raw.split(",")):
        if x:
            try:
                good.append(convert(x))
            except ValueError:
                bad.append(x)
    return good, bad


def _decode_value(kind: str, raw: str) -> tuple[Any, list[str]]:
    """(value, bad parts) for one query value; raises ValueError when nothing of it can be read.
    A list keeps its valid items and reports the others."""
    if kind == "str":
        return raw, []
    if kind == "int":
        return int(raw), []
    if kind == "float":
        return _finite(raw), []
    if kind == "bool":
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
            raise ValueError(raw)
        return raw.lower() in ("1", "true", "yes", "on"), []
    if kind == "ints":
        return _items(raw, int)
    if kind == "floats":
        return _items(raw, _finite)
    if kind == "strs":
        return [x for x in raw.split(",") if x], []
    raise ValueError(f"unknown state kind {kind!r}")


def _encode_value(kind: str, value: Any) -> str:
    if kind == "bool":
        return "1" if value else "0"
    if kind in ("ints", "floats", "strs"):
        return ",".join(str(x) for x in value)
    return str(value)


def defaults(page: str) -> dict[str, Any]:
    return {name: (list(d) if isinstance(d, list) else d) for name, (_, d) in PAGE_STATE[page].items()}


def decode_state(page: str, params: Mapping[str, str]) -> dict[str, Any]:
    """Query parameters -> the page's full state (missing or malformed fields take their default)."""
    return decode_state_checked(page, params)[0]


def decode_state_checked(page: str, params: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """As `decode_state`, and what was ignored, in words: a value that is not of its field's kind
    ("layer=abc (not an integer)"), the unreadable items of a list, a parameter this page does not have."""
    state, ignored = defaults(page), []
    schema = PAGE_STATE[page]
    for name, raw in params.items():
        if raw is None:
            continue
        if name not in schema:
            if not name.startswith("embed"):  # Streamlit's own embedding options
                ignored.append(f"{name}={raw} (not a setting of this page)")
            continue
        kind = schema[name][0]
        try:
            state[name], bad = _decode_value(kind, str(raw))
        except ValueError:
            ignored.append(f"{name}={raw} (not {_KIND_WORDS.get(kind, kind)})")
            continue
        if bad:
            ignored.append(f"{name}: {', '.join(bad)} (not {_KIND_WORDS.get(kind, kind)})")
    return state, ignored


def encode_state(page: str, state: Mapping[str, Any]) -> dict[str, str]:
    """A page's state -> query parameters, leaving out fields equal to their default."""
    out = {}
    for name, (kind, default) in PAGE_STATE[page].items():
        value = list(state[name]) if isinstance(state.get(name), tuple) else state.get(name)  # a range slider's
        if name in state and value != default:
            out[name] = _encode_value(kind, value)
    return out


def coerce_state(page: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """A stored state (URL text, typed values, or a mix, as saved views hold) -> the page's full state."""
    text = {}
    for name, (kind, _) in PAGE_STATE[page].items():
        if name in state and state[name] is not None:
            v = state[name]
            text[name] = v if isinstance(v, str) else _encode_value(kind, v)
    return decode_state(page, text)


DEFAULT_PAGE = "editor"  # served at the app's root URL (Streamlit gives the default page no path)


def page_path(page: str) -> str:
    return "" if page == DEFAULT_PAGE else page


def share_url(base_url: str, page: str, state: Mapping[str, Any]) -> str:
    """The link that reopens this view: `<app>/<page>?<state>` (the editor lives at `<app>/`)."""
    query = urlencode(encode_state(page, state))
    return f"{base_url.rstrip('/')}/{page_path(page)}" + (f"?{query}" if query else "")
