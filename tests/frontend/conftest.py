import pytest
import streamlit as st

from tests.frontend.fake_api import FakeApi


@pytest.fixture
def fake_api(monkeypatch):
    """Route every dashboard API call to a FakeApi (caches cleared so no test sees another's data)."""
    from frontend import api

    fake = FakeApi()
    monkeypatch.setattr(api, "get_client", lambda: fake)
    st.cache_data.clear()
    st.cache_resource.clear()
    yield fake
    st.cache_data.clear()
