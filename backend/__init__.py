"""AAH Studio service: FastAPI over a SQLite run store (entry point: ``backend.app:app``)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aah-studio")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
