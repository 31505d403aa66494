"""The service sends no telemetry, whatever the environment: FastAPI (0.165, pinned) records OpenTelemetry
spans and metrics of every request once any library in the process sets a global provider, and with
FASTAPI_OTEL_AUTO_CONFIGURE=true it adds exporters to the OTLP endpoint the environment names.
create_app turns all of it off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a child process: OpenTelemetry's global providers can be set only once per process.
PROBE = """
import sys
from pathlib import Path
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from fastapi.testclient import TestClient
from backend.app import API_PREFIX, create_app
from backend.settings import Settings

with TestClient(create_app(Settings(data_dir=Path(sys.argv[1]), demo_dir=None, suite_files=[]))) as client:
    assert client.get(f"{API_PREFIX}/health").status_code == 200
    assert client.get(f"{API_PREFIX}/runs/999999").status_code == 404
data = reader.get_metrics_data()
recorded = [] if data is None else [m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics]
print("spans", [s.name for s in spans.get_finished_spans()], "metrics", recorded)
"""


def test_requests_leave_no_spans_metrics_or_exports(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FASTAPI_OTEL_AUTO_CONFIGURE": "true",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "AAH_API_TOKEN": ""}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "spans [] metrics []", proc.stdout[-2000:]
