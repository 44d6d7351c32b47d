"""The engine: writes, views, ticks and streams, with no web framework in it."""
