"""Measuring a model under a plan: losses and prefix-cached re-evaluation (evaluate.py), attention maps,
retained mass and the one-head sensitivity sweep (diagnostics.py), and allocation under a coverage budget
(allocate.py)."""
