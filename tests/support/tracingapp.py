"""The traced counter of docs/tracing.md, its spans kept in memory and served for the tests.

`GET /spans` answers every span ended so far (tests/ops/test_tracing.py reads them back);
`POST /orphan` is a command whose batch fails at its COMMIT (a deferred foreign key), beside the
docs' own `/add`. The database is `counter.db` in the working directory, as in the docs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.orphan import Orphan, add_orphan_tables

DOCS_APP = Path(__file__).resolve().parents[2] / "docs" / "src" / "tracing" / "app.py"

spec = importlib.util.spec_from_file_location("docs_tracing_app", DOCS_APP)
assert spec is not None and spec.loader is not None
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)
app: FastAPI = docs.app

memory = InMemorySpanExporter()
provider = trace.get_tracer_provider()
assert isinstance(provider, TracerProvider)
provider.add_span_processor(SimpleSpanProcessor(memory))  # exported as each span ends

add_orphan_tables("counter.db")  # the docs' app opens counter.db in the working directory
docs.lith.command(app, "/orphan", Orphan)


def _span(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace": f"{context.trace_id:032x}",
        "id": f"{context.span_id:016x}",
        "parent": None if parent is None else f"{parent.span_id:016x}",
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "description": span.status.description,
        "attributes": {key: list(v) if isinstance(v, tuple) else v for key, v in (span.attributes or {}).items()},
        "events": [event.name for event in span.events],
    }


@app.get("/spans")
def spans() -> list[dict[str, Any]]:
    return [_span(span) for span in memory.get_finished_spans()]
