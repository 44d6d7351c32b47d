"""The engine (fastapi_lith/engine/): writer, SQLite, feed, hub, streams, encoders, views, commands."""
