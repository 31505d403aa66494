"""The shared contracts at the bottom of the house: pydantic request/response models (base.py: bases
and shared types; models.py, runs.py, views.py, tracking.py by resource) and the error types every
layer raises (errors.py).

May import nothing else of the backend.
"""
