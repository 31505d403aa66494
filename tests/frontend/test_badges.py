"""frontend/badges.py: the number badges that replace st.metric on the editor (issue 23's cold open)."""

from frontend.badges import BAD, GOOD, Badge, badge_html, row_html
from tests.frontend.test_pages import BadgeReader


def test_a_rise_of_a_lower_is_better_number_is_red_and_points_up():
    rise = badge_html(Badge("Δloss vs own plan", "+0.0172", "+1.12 %", lower_is_better=True))
    fall = badge_html(Badge("Δloss vs own plan", "-0.0172", "-1.12 %", lower_is_better=True))
    assert f"color:{BAD}" in rise and "▲ +1.12 %" in rise
    assert f"color:{GOOD}" in fall and "▼ -1.12 %" in fall
    up = badge_html(Badge("retrieval", "0.61", "+0.10"))  # higher is better: a rise is good
    assert f"color:{GOOD}" in up and "▲" in up


def test_a_badge_without_a_delta_keeps_the_deltas_line_so_nothing_moves_when_one_appears():
    without, with_delta = badge_html(Badge("x", "1")), badge_html(Badge("x", "1", "+2 %"))
    height = 'class="aah-delta" style="'
    assert "height:1.3rem" in without.split(height)[1].split('"')[0]
    assert "height:1.3rem" in with_delta.split(height)[1].split('"')[0]


def test_labels_values_and_help_are_escaped_and_read_back_in_order():
    html = row_html([Badge("a<b>", "1 & 2", help='say "hi"'), Badge("loss (nats)", "1.5259")])
    assert "<b>" not in html and "&lt;b&gt;" in html and 'title="say &quot;hi&quot;"' in html
    reader = BadgeReader()
    reader.feed(html)
    assert reader.found == {"a<b>": "1 & 2", "loss (nats)": "1.5259"}
