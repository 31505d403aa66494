"""Models the API could not open (GET /models/unavailable) are named under the model picker, each with
its reason; nothing is said when every model opened."""

import pytest

from tests.frontend.test_pages import page

GONE = [{"id": "huge", "name": "Huge LM", "reason": "model.d_model must be an integer in [1, 32,768]"},
        {"id": "broken", "name": "broken", "reason": "weight shapes do not match the config"}]


def note(at) -> list[str]:
    return [c.value for c in at.caption if "could not be opened" in c.value]


def reasons(at) -> list[list[str]]:
    return [[t.value for t in e.text] for e in at.expander if e.label == "Which, and why"]


@pytest.mark.parametrize("name", ["editor", "attention"])
def test_unavailable_models_are_counted_and_each_reason_is_listed(fake_api, name):
    fake_api.unavailable_store = GONE
    at = page(name)
    assert not at.exception and not at.error
    assert note(at) == ["2 models could not be opened"]
    assert reasons(at) == [[f"{m['name']} ({m['id']}): {m['reason']}" for m in GONE]]


@pytest.mark.parametrize("name", ["editor", "attention"])
def test_nothing_is_said_when_every_model_opened(fake_api, name):
    at = page(name)
    assert not at.exception and fake_api.called("unavailable_models")
    assert note(at) == [] and reasons(at) == []


def test_one_unavailable_model_is_singular_and_shown_even_when_none_opened(fake_api, monkeypatch):
    fake_api.unavailable_store = GONE[:1]
    monkeypatch.setattr(fake_api, "models", lambda: [])
    at = page("editor")
    assert not at.exception
    assert note(at) == ["1 model could not be opened"]
    assert reasons(at) == [[f"Huge LM (huge): {GONE[0]['reason']}"]]
