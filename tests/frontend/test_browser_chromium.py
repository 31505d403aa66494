"""The Chromium the browser tests and bench/ui.py drive: started with Playwright's own disabled features
kept (Chromium takes only the last --disable-features switch, so ours must repeat them), and with no
address-bar popup renderer nor spare renderer beside each opened page (tests/frontend/stack.py says why)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.frontend import stack as S

pytestmark = [pytest.mark.browser]


def processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process this user can read. Chromium's child processes rewrite
    their title into one space-separated string, so arguments are split on whitespace too."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked
        out[int(entry.name)] = (parent, " ".join(argv).split())
    return out


def descends_from(pid: int, ancestor: int, table: dict[int, tuple[int, list[str]]]) -> bool:
    while pid in table and pid > 1:
        pid = table[pid][0]
        if pid == ancestor:
            return True
    return False


def our_browser(table: dict[int, tuple[int, list[str]]]) -> int:
    """The pid of the Chromium browser process this test process started (through Playwright's driver)."""
    found = [pid for pid, (_, argv) in table.items()
             if "--remote-debugging-pipe" in argv and not any(a.startswith("--type=") for a in argv)
             and descends_from(pid, os.getpid(), table)]
    assert len(found) == 1, f"expected one Chromium started by this process, found {found}"
    return found[0]


def test_playwrights_disabled_features_are_kept_and_ours_added(live):
    table = processes()
    argv = table[our_browser(table)][1]
    lists = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--disable-features=")]
    assert len(lists) >= 2, argv  # Playwright's and ours
    effective = set(lists[-1])
    for earlier in lists[:-1]:
        assert set(earlier) <= effective, f"dropped by the last --disable-features: {set(earlier) - effective}"
    assert set(S.NO_EXTRA_RENDERERS) <= effective


def renderers() -> dict[int, list[str]]:
    """pid -> argv of the renderer processes of this process's Chromium."""
    table = processes()
    root = our_browser(table)
    return {pid: argv for pid, (_, argv) in table.items()
            if "--type=renderer" in argv and descends_from(pid, root, table)}


def test_an_opened_page_has_only_its_own_renderer(live):
    stack, browser = live
    before = renderers()  # pages an earlier test left open keep theirs
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{stack.ui_url}/_stcore/health")
        started = [argv for pid, argv in renderers().items() if pid not in before]
        assert not [argv for argv in started if "--top-chrome-webui" in argv]
        assert len(started) == 1, started
    finally:
        context.close()
