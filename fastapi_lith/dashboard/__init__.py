"""A live dashboard of the app's own metrics, built with the library's views, hub and streams."""

from .router import Dashboard

__all__ = ["Dashboard"]
