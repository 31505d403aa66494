"""Per-page URL state: each page's query parameters as a typed schema, and share links. Pure."""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlencode

# Each page's state is a flat dict; these schemas give each field a kind and a default. Defaults are
# left out of the URL, so links stay short and an empty URL means "the defaults".

PAGE_STATE: dict[str, dict[str, tuple[str, Any]]] = {
    "editor": {"model": ("str", ""), "plan": ("str", ""), "eval": ("str", "mixed"),
               "layer": ("int", 0), "head": ("int", 0), "metric": ("str", "causal_coverage")},
    "attention": {"model": ("str", ""), "text": ("str", ""), "layer": ("int", 0), "head": ("int", 0),
                  "window": ("str", "own"), "bucket": ("int", 0),
                  "scale": ("str", "linear")},
    "runs": {"experiment": ("str", ""), "preset": ("str", ""), "status": ("str", ""), "q": ("str", ""),
             "allparams": ("bool", False), "paper": ("bool", True), "source": ("str", ""), "group": ("str", ""),
             "tag": ("str", ""), "bygroup": ("bool", False), "metric": ("str", "val_loss")},
    "acr": {"run": ("int", 0), "keys": ("strs", ["val_loss", "train_loss"]), "smooth": ("float", 0.6),
            "step": ("int", -1), "band": ("str", "")},
    "compare": {"runs": ("ints", []), "keys": ("strs", ["val_loss"]), "agg": ("str", "last"),
                "step": ("int", 0), "paper": ("bool", False), "smooth": ("float", 0.6), "mode": ("str", "runs"),
                "groups": ("strs", []), "band": ("str", "std"), "suite": ("str", ""), "rkey": ("str", "val_loss")},
    "present": {"deck": ("ints", []), "slide": ("int", 0), "mode": ("str", "")},
}


_KIND_WORDS = {"int": "an integer", "float": "a number", "ints": "integers", "bool": "on/off"}


def _decode_value(kind: str, raw: str) -> tuple[Any, list[str]]:
    """(value, bad parts) for one query value; raises ValueError when nothing of it can be read.
    A list keeps its valid items and reports the others."""
    if kind == "str":
        return raw, []
    if kind == "int":
        return int(raw), []
    if kind == "float":
        value = float(raw)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(raw)
        return value, []
    if kind == "bool":
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
            raise ValueError(raw)
        return raw.lower() in ("1", "true", "yes", "on"), []
    if kind == "ints":
        good, bad = [], []
        for x in (x.strip() for x in raw.split(",")):
            if x:
                try:
                    good.append(int(x))
                except ValueError:
                    bad.append(x)
        return good, bad
    if kind == "strs":
        return [x for x in raw.split(",") if x], []
    raise ValueError(f"unknown state kind {kind!r}")


def _encode_value(kind: str, value: Any) -> str:
    if kind == "bool":
        return "1" if value else "0"
    if kind in ("ints", "strs"):
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
        if name in state and state[name] != default:
            out[name] = _encode_value(kind, state[name])
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
