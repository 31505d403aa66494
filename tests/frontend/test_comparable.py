"""Which runs may share an axis: families, the default selection, plan shapes."""

from frontend import comparable

TINY = {"model.n_layer": "4", "model.n_head": "4", "model.d_model": "128", "model.seq_len": "256"}


def run(i, params, read_only=False):
    return {"id": i, "name": f"r{i}", "params": params, "read_only": read_only}


def test_family_names_the_shape_or_the_papers_model():
    assert comparable.run_family(run(1, TINY)) == "4×4 heads, d=128, T=256"
    assert comparable.run_family(run(2, {"model": "1b"}, read_only=True)) == "paper: 1b model"
    assert "shape not recorded" in comparable.run_family(run(3, {}))


def test_default_selection_never_mixes_families():
    runs = [run(9, {"model": "1b"}, True), run(1, TINY), run(8, {"model": "1b"}, True), run(2, TINY)]
    assert comparable.default_selection(runs) == [9, 8]
    assert comparable.default_selection(runs[1:]) == [1, 2]
    assert comparable.default_selection([]) == []
    assert comparable.families(runs) == {"paper: 1b model": [9, 8], "4×4 heads, d=128, T=256": [1, 2]}


def test_plan_shape():
    assert comparable.plan_shape(run(1, TINY)) == (4, 4)
    assert comparable.plan_shape(run(2, {"model": "1b"}, True)) is None
