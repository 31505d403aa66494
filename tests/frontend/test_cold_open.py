"""frontend/cold_open.py: the opening sentence comes from the model's own numbers."""

from frontend import cold_open


def test_the_sentence_names_the_head_the_smallest_window_hurts_most():
    buckets = [None, 16, 4]  # the smallest window is not the first bucket
    delta = [[[0.0, 0.02, 0.05], [0.0, 0.0, 0.41]], [[0.0, 0.1, 0.002], [0.0, 0.0, 0.03]]]
    line = cold_open.from_sensitivity(delta, buckets)
    assert line.startswith(cold_open.WHAT)
    assert "layer 0 head 1 needs far context most" in line and "rises by 0.410 nats" in line
    assert "layer 1 head 0: +0.002" in line and "pick L0H1 below and set it to 4" in line
    # another model, another sentence: nothing is written in by hand
    delta[1][1][2] = 0.9
    assert "pick L1H1 below" in cold_open.from_sensitivity(delta, buckets)


def test_nothing_to_say_gives_no_sentence():
    assert cold_open.from_sensitivity([[[0.0, 0.0]]], [4, None]) is None  # no head minds a small window
    assert cold_open.from_sensitivity([[[0.1]]], [None]) is None  # no integer window to try
    assert cold_open.from_retained_mass([[[0.5]]], [None]) is None


def test_the_retained_mass_sentence_names_the_head_that_looks_furthest_back():
    mass = [[[0.9, 1.0], [0.2, 1.0]], [[0.6, 1.0], [0.95, 1.0]]]
    line = cold_open.from_retained_mass(mass, [8, None])
    assert "layer 0 head 1 looks furthest back (only 20% of its attention falls within the last 8" in line
    assert "layer 1 head 1: 95%" in line and "pick L0H1 below, set it to 8" in line
