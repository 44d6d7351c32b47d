"""One base for every error the library raises, so an app can catch them all at once."""

from __future__ import annotations


class LithError(Exception):
    """The base of fastapi-lith's own errors."""
