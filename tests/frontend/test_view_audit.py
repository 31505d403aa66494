"""Issue 23, item 3: a saved view restores every control of its page.

Each page is opened from a link that sets its fields to values other than the defaults (together, the
links of a page set every field of url_state.PAGE_STATE, or the test fails), with every lazy part
open. Then every control the page drew must be a field of the view, restored to the link's value, or
be listed in url_state.NOT_VIEW_STATE with the reason it is not part of a view; and the page writes
back exactly the link (what Save view stores: components.share_bar). So a control added later
without view support fails here."""

import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Widget

from frontend import groups, url_state
from tests.frontend.test_pages import first_paint, open_expander, page, url

# page -> links; together a page's links set every one of its fields to a value other than its default
LINKS: dict[str, list[dict[str, str]]] = {
    "editor": [{"model": "demo", "plan": "4.4.4.4_8.full.4.4", "eval": "english", "layer": "1", "head": "2",
                "metric": "acr", "xaxis": "kv_bytes", "runsplot": "1", "sinks": "2"}],
    "attention": [{"model": "demo", "text": "c1", "layer": "1", "head": "2", "window": "8", "scale": "log",
                   "side": "1", "query": "2", "querymap": "full", "tau": "0.75", "sens": "1", "bucket": "1"},
                  {"rm": "0"}],
    "runs": [{"experiment": "demo", "preset": "demo", "status": "FINISHED", "q": "aah", "allparams": "1",
              "paper": "0", "source": "suite", "group": "full_adaptive", "tag": "t", "maxloss": "2.4",
              "cov": "0.1,0.9"},
             {"bygroup": "1", "metric": "acr"}],
    "acr": [{"run": "2", "keys": "val_loss,acr", "smooth": "0.3", "step": "10", "band": "std", "steps": "10,20"}],
    "compare": [{"runs": "1,2", "keys": "val_loss,acr", "agg": "at_step", "step": "20", "paper": "1", "smooth": "0.2",
                 "diffa": "2", "diffb": "1"},
                {"mode": "groups", "groups": groups.group_key({"experiment": "demo", "group": "full_adaptive"}),
                 "band": "minmax", "keys": "acr"},
                {"mode": "reproduction", "suite": "demo", "corpus": "code", "rkey": "acr"}],
    "present": [{"deck": "2,1", "slide": "1", "mode": "present"}],
}
# every page has "<page>._share" besides these
LAZY = {"editor": ["editor._gen_open", "editor._serving", "editor._table_open", "editor._ret_open"]}


def _widgets(at: AppTest) -> list[Widget]:
    out, todo = [], [at._tree]
    while todo:
        node = todo.pop()
        if isinstance(node, Widget):
            out.append(node)
        todo.extend(getattr(node, "children", {}).values())
    return out


def _field(page_name: str, key: str | None) -> str | None:
    """The view field a widget key is bound to (`<page>.<field>`, or `<page>.<field>.<anything>`)."""
    if not key or not key.startswith(page_name + "."):
        return None
    name = key[len(page_name) + 1:]
    return next((f for f in url_state.PAGE_STATE[page_name] if name == f or name.startswith(f + ".")), None)


def _declared(page_name: str, key: str | None) -> bool:
    name = (key or "")[len(page_name) + 1:] if (key or "").startswith(page_name + ".") else None
    return name is not None and any(name == n or name.startswith(n + ".") for n in url_state.NOT_VIEW_STATE[page_name])


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _open(fake_api, page_name: str, link: dict[str, str], lazy: bool = True) -> AppTest:
    """The page opened from `link`, its share bar open (and with `lazy`, every lazy part)."""
    if page_name == "present":
        fake_api.create_view("one", "editor", {"plan": "4.4.4.4_8.full.4.4"})
        fake_api.create_view("two", "acr", {"run": "1", "band": "std"})
    at = first_paint(page(page_name, **link), page_name)  # the editor's charts (its x axis, stored runs)
    for key in [f"{page_name}._share", *(LAZY.get(page_name, []) if lazy else [])]:
        open_expander(at, key)
    return at


@pytest.mark.parametrize("page_name", list(url_state.PAGE_STATE))
def test_the_links_set_every_field_of_the_page(page_name):
    fields = {f for link in LINKS[page_name] for f in link}
    assert fields == set(url_state.PAGE_STATE[page_name]), "add the new field to a link above"
    for link in LINKS[page_name]:
        assert url_state.encode_state(page_name, url_state.decode_state(page_name, link)) == link  # non-defaults


@pytest.mark.parametrize("page_name,i", [(p, i) for p, links in LINKS.items() for i in range(len(links))])
def test_a_saved_view_restores_every_control_of_its_page(fake_api, page_name, i):
    link = LINKS[page_name][i]
    at = _open(fake_api, page_name, link)
    assert not at.exception and not at.warning, [w.value for w in at.warning]  # nothing of the link was ignored
    state = url_state.decode_state(page_name, link)
    unbound = []
    for w in _widgets(at):
        # a form's submit button has no key of its own: it is named by its form's ("FormSubmitter:<form>-<label>")
        key = w.key or w.id
        key = key.split(":", 1)[1].rsplit("-", 1)[0] if key.startswith("FormSubmitter:") else key
        field = _field(page_name, key)
        if field is None:
            if not _declared(page_name, key):
                unbound.append(key)
            continue
        if field in link:
            assert _plain(w.value) == state[field], f"{w.key} shows {w.value!r}, the link said {link[field]}"
    assert not unbound, f"controls neither in the view (url_state.PAGE_STATE) nor in NOT_VIEW_STATE: {unbound}"
    assert {k: v for k, v in url(at).items() if k in link} == link  # the view written back is the link


def _traces(fig: dict) -> list:
    """What a chart draws: each trace's kind, name, points, texts and colours, and the chart's title
    (layout sizes differ on slides)."""
    title = (fig["layout"].get("title") or {}).get("text")
    return [title] + [(t.get("type"), t.get("name"), t.get("x"), t.get("y"), t.get("z"), t.get("text"),
                       t.get("hovertemplate"), (t.get("line") or {}).get("color"), (t.get("marker") or {}).get("color"),
                       t.get("fillcolor")) for t in fig["data"]]


# charts a page draws that are no part of its slide, and why (matched as the chart's key, `<page>.<name>[.*]`)
NOT_ON_SLIDES = {"attention": {"_grid": "the head picker (a control, in a closed expander): the slide shows the head"}}
PARITY = [("acr", LINKS["acr"][0]), ("compare", LINKS["compare"][0]), ("compare", LINKS["compare"][1]),
          ("compare", LINKS["compare"][2]), ("editor", LINKS["editor"][0]), ("editor", {"model": "demo", "metric": "acr"}),
          ("attention", {"model": "demo", "layer": "1", "head": "2", "scale": "log"}),  # the retained mass is on by default
          ("attention", LINKS["attention"][0]), ("attention", LINKS["attention"][1])]


@pytest.mark.parametrize("page_name,link", PARITY)
def test_the_slide_draws_the_pages_charts_as_the_page_drew_them(fake_api, page_name, link):
    """A saved view's slide (and the exported deck: the same Section) draws each of its charts with the
    page's points and colours, and every chart the page opened from the view's link drew is on it. What
    the page draws only after an action in its session is no part of a view (the editor's allocation
    curve, a button; its serving grains' points on the loss plot, an expander), so its lazy parts stay shut."""
    import json

    from frontend import views

    at = _open(fake_api, page_name, link, lazy=False)
    drawn = {json.dumps(_traces(json.loads(c.proto.spec)), sort_keys=True, default=str): c.proto.id
             for c in at.get("plotly_chart")}
    section = views.build_section(page_name, url_state.decode_state(page_name, link))
    slide = {json.dumps(_traces(f.to_plotly_json()), sort_keys=True, default=str): name
             for name, f in section.figures.items()}
    missing = [slide[k] for k in slide if k not in drawn and slide[k] != "grid"]  # the editor's map is the component
    assert not missing, f"on the slide, not as the page drew them: {missing}"
    skip = tuple(f"{page_name}.{name}" for name in NOT_ON_SLIDES.get(page_name, {}))
    left_out = [drawn[k] for k in drawn if k not in slide and not drawn[k].split("-", 2)[-1].startswith(skip)]
    assert not left_out, f"drawn by the page, not on its slide: {left_out}"


@pytest.mark.parametrize("link", [{}, {"paper": "0"}, {"maxloss": "2.4"}, {"cov": "0.45,1.0"}, {"q": "uniform"},
                                  {"bygroup": "1", "metric": "acr"}])
def test_the_runs_slide_lists_the_rows_the_page_lists(fake_api, link):
    """The Runs page draws a table, not a chart: its slide's table has the page's rows (the paper toggle,
    the loss ceiling and the coverage range included) and columns, or with Group seeds the page's groups."""
    from frontend import views

    at = _open(fake_api, "runs", link, lazy=False)
    shown = at.dataframe[0].value
    table = views.build_section("runs", url_state.decode_state("runs", link)).figures["table"].data[0]
    assert list(table.header.values) == list(shown.columns)
    first = shown.columns[0]  # the run's id, or the group's name
    assert [str(v) for v in table.cells.values[0]] == [str(v) for v in shown[first]]
    assert 0 < len(shown) < (3 if link else 4)  # each link leaves some rows out, and not all
