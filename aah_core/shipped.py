"""Where the shipped data (bundled corpus, demo checkpoint) lives.

In a source checkout it is the repository's ``data/``; an installed wheel carries the same
files under ``<prefix>/share/aah-studio`` (pyproject's data-files).
"""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE_DATA = Path(__file__).resolve().parents[1] / "data"
INSTALLED_DATA = Path(sys.prefix) / "share" / "aah-studio"


def shipped_data_dir() -> Path:
    """The folder holding corpus/ and demo/: the checkout's data/ when present, else the installed copy."""
    return SOURCE_DATA if (SOURCE_DATA / "corpus").is_dir() else INSTALLED_DATA
