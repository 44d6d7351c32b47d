"""The same-origin rule on its own, request by request (the writer's dependency and the app's
routes apply it: tests/engine/test_writer.py and tests/app/test_lith.py check it there, over ASGI and HTTP)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from fastapi_lith.web.origin import cross_site_reason, same_origin_reason


def request(headers: dict[str, str], scheme: str = "http", host: str = "app.test") -> Request:
    raw = [(b"host", host.encode())] + [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "scheme": scheme, "path": "/", "query_string": b"", "headers": raw})


@pytest.mark.parametrize(
    ("headers", "scheme", "reason"),
    [
        ({"Sec-Fetch-Site": "same-origin"}, "http", None),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://evil.example"}, "http", None),  # the browser's word wins
        ({"Sec-Fetch-Site": "same-site"}, "http", "cross-site request refused (Sec-Fetch-Site: same-site)"),
        ({"Sec-Fetch-Site": "none"}, "http", "cross-site request refused (Sec-Fetch-Site: none)"),
        ({"Origin": "http://app.test"}, "http", None),
        ({"Origin": "https://app.test"}, "https", None),
        ({"Origin": "http://app.test"}, "https", "cross-site request refused (Origin http://app.test is not https://app.test)"),
        ({"Origin": "https://app.test"}, "http", "cross-site request refused (Origin https://app.test is not http://app.test)"),
        ({"Origin": "null"}, "http", "cross-site request refused (Origin null is not http://app.test)"),
        (
            {"Origin": "http://app.test.evil.example"},
            "http",
            "cross-site request refused (Origin http://app.test.evil.example is not http://app.test)",
        ),
        ({"Origin": "http://evil.example"}, "http", "cross-site request refused (Origin http://evil.example is not http://app.test)"),
        ({}, "http", "cross-site request refused (no Sec-Fetch-Site or Origin header)"),
    ],
)
def test_same_origin_reason(headers: dict[str, str], scheme: str, reason: str | None) -> None:
    assert same_origin_reason(request(headers, scheme)) == reason
    # A command request also needs Datastar's header, then the same rule applies.
    assert cross_site_reason(request({**headers, "Datastar-Request": "true"}, scheme)) == reason


@pytest.mark.parametrize("value", [None, "false", "1", "TRUE"])
def test_a_command_request_must_come_from_datastar(value: str | None) -> None:
    headers = {"Sec-Fetch-Site": "same-origin"} | ({} if value is None else {"Datastar-Request": value})
    assert cross_site_reason(request(headers)) == "command requests must come from Datastar (Datastar-Request: true)"


def test_the_port_is_part_of_the_origin() -> None:
    assert same_origin_reason(request({"Origin": "http://app.test:8000"}, host="app.test:8000")) is None
    assert same_origin_reason(request({"Origin": "http://app.test:8001"}, host="app.test:8000")) is not None
