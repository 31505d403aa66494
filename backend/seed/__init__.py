"""What a fresh store is given: the shipped demo run and model (demo.py), the packed mini-scale suite
(suite.py) and the paper's reported tables as a read-only experiment (paper.py). Idempotent.

May import: settings, store, schemas.
"""
