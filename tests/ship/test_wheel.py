"""An installed wheel (not the checkout) carries the corpus, the demo checkpoint, the shipped suites and the
migrations."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import tempfile
from fastapi.testclient import TestClient
import aah_core
from aah_core.shipped import shipped_data_dir
from backend.app import create_app
from backend.settings import Settings
assert aah_core.__file__.startswith(PREFIX), aah_core.__file__
assert str(shipped_data_dir()).startswith(PREFIX), shipped_data_dir()
with TestClient(create_app(Settings(data_dir=tempfile.mkdtemp()))) as client:
    models = client.get("/api/v1/models").json()
    assert [m["id"] for m in models] == ["demo"], models
    plan = client.get("/api/v1/models/demo/windows").json()["windows"]
    result = client.post("/api/v1/models/demo/evaluate", json={"windows": plan}).json()
    assert result["delta"] == 0.0 and result["loss"] > 0, result
    suite = client.get("/api/v1/runs", params={"source": "suite", "limit": 1000}).json()
    assert {r["params"]["suite.scale"] for r in suite} == {"mini", "long"}, len(suite)  # both shipped packs
print("ok")
"""


def _dev_install() -> str | None:
    """Where this venv's own aah-studio install (the editable one of `make setup`) lives, or None."""
    proc = subprocess.run([sys.executable, "-m", "pip", "show", "aah-studio"], capture_output=True, text=True,
                          timeout=120)
    return proc.stdout if proc.returncode == 0 else None


def test_installed_wheel_serves_the_demo_from_its_own_files(tmp_path):
    before = _dev_install()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    prefix = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    # the dependencies come from this venv (a .pth line adds its site-packages; its editable finder is not run)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = wheels.glob("*.whl")
    # --ignore-installed: without it pip uninstalls this venv's editable aah-studio (then `make demo`, whose
    # stamp says the venv is ready, has no .venv/bin/aah), or skips the prefix when the versions match
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--prefix",
                    str(prefix), str(wheel)], check=True, capture_output=True, timeout=300)
    assert _dev_install() == before, "installing the wheel into a prefix changed this venv's own install"
    assert (prefix / "share" / "aah-studio" / "demo" / "model.safetensors").is_file()
    proc = subprocess.run([str(prefix / "bin" / "python"), "-c", f"PREFIX = {str(prefix)!r}\n" + CHECK],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
