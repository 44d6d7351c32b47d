"""The web tests' shared fixture: a tab's stream on the module's own `served` app."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessServer
from tests.web.test_input import TabStream


@pytest.fixture
def stream(served: tuple[InProcessServer, Path], request: pytest.FixtureRequest) -> Iterator[TabStream]:
    tab = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[-64:]
    tab_stream = TabStream(served[0], tab)
    tab_stream.tab = tab  # type: ignore[attr-defined]
    tab_stream.wait_for('data-signals:done="0"')
    yield tab_stream
    tab_stream.close()
