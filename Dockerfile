# AAH Studio: one image for both services (docker-compose.yml runs it as `api` and as `ui`).
#
#   docker build -t aah-studio .                                   # CPU torch (default)
#   docker build -t aah-studio:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# The torch wheel is fetched at build time only; the running container needs no network.
# Any BASE_IMAGE works if it is Debian/Ubuntu based: Python 3.11 is installed with apt when the
# base does not have it (the CUDA images do not).

ARG BASE_IMAGE=python:3.11-slim

# ---- base: Python 3.11 and an unprivileged user, shared by both stages --------------------------
FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 aah \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin aah

# ---- build: a virtual environment with the pinned dependencies and the project ------------------
FROM base AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY requirements.txt ./
# torch first, from the chosen index (CPU by default), so that requirements.txt finds it satisfied
# instead of pulling the multi-GB CUDA build from PyPI.
RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0 \
    && pip install -r requirements.txt
# Optional extra packages, e.g. EXTRAS="ray[default]==2.60.0" for the ray target and the compose `ray` head.
ARG EXTRAS=""
# hadolint ignore=DL3013
RUN if [ -n "${EXTRAS}" ]; then pip install ${EXTRAS}; fi
COPY pyproject.toml README.md ./
COPY aah_core ./aah_core
COPY backend ./backend
COPY frontend ./frontend
# the dashboard's settings (offline, no tracebacks, no full GC after each run), read from the working directory
COPY .streamlit ./.streamlit
COPY aah_client ./aah_client
COPY aah_tracking ./aah_tracking
COPY aah_launcher ./aah_launcher
COPY bench ./bench
COPY data ./data
# Editable, so that backend/ finds the shipped demo checkpoint under /app/data/demo.
RUN pip install --no-deps -e .

# ---- runtime ------------------------------------------------------------------------------------
FROM base AS runtime
# A C compiler for the attention kernel (aah_core/attention/band_kernel.c), which each process builds on its first
# use for the host's own CPU (about 0.3 s). Without one, CPU attention runs on ATen's kernels only (README, "Known
# limits"): `--build-arg ATTENTION_COMPILER=` makes that image, about 200 MB smaller.
ARG ATTENTION_COMPILER=gcc
# hadolint ignore=DL3008
RUN if [ -n "${ATTENTION_COMPILER}" ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${ATTENTION_COMPILER}" libc6-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH \
    AAH_DATA_DIR=/data \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false
RUN mkdir -p /data && chown 10001:10001 /data
VOLUME ["/data"]
WORKDIR /app
USER 10001:10001
EXPOSE 8000 8501
# The API's health path; the `ui` service overrides it with Streamlit's /_stcore/health.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=4)"]
# The API. Inside a container it listens on all interfaces (container ports are fixed: 8000 and
# 8501); docker-compose.yml publishes only the dashboard's port, on the host's loopback by default.
CMD ["python", "-m", "uvicorn", "backend.app:app", "--host", "0.0.0.0", "--port", "8000", "--http", "backend.api.protocol:TimedH11Protocol"]
