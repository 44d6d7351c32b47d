"""`Accept-Encoding` negotiation: which of the stream encoders a request gets (RFC 9110)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Server preference, best first: zstd is the cheapest per frame and the only one that hibernates.
ENCODINGS: tuple[str, ...] = ("zstd", "br", "gzip", "identity")


def _parse_accept_encoding(header: str) -> dict[str, float]:
    """Codings to their q-value; entries with a malformed q are dropped, as if absent."""
    qvalues: dict[str, float] = {}
    for entry in header.split(","):
        coding, *params = entry.split(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = math.nan
        if not 0.0 <= q <= 1.0:  # also false for nan
            continue
        if coding == "x-gzip":  # RFC 9110 treats it as gzip
            coding = "gzip"
        qvalues.setdefault(coding, q)
    return qvalues


def negotiate(
    accept_encoding: str | None, available: Sequence[str] = ENCODINGS
) -> str | None:
    """The coding to answer with, or None when nothing offered is acceptable (answer 406).

    The client's q-values rank first; among equal ones `available`'s order decides (zstd,
    br, gzip, identity). `*` stands for every coding not named. identity is acceptable unless
    refused (`identity;q=0`, or `*;q=0` without naming identity), and when neither named nor
    covered by `*` it ranks after every coding the client named. No header, or an empty one,
    means identity.
    """
    if accept_encoding is None or not accept_encoding.strip():
        return "identity" if "identity" in available else None
    qvalues = _parse_accept_encoding(accept_encoding)
    star = qvalues.get("*")
    best: str | None = None
    best_q = 0.0
    for coding in available:
        if coding in qvalues:
            q = qvalues[coding]
        elif star is not None:
            q = star
        elif coding == "identity":
            q = 0.001  # the lowest q there is: acceptable, but only when nothing else is
        else:
            continue
        if q > best_q:
            best, best_q = coding, q
    return best
