"""The backends beside the engine (fastapi_lith/backends/): PostgreSQL against a real server."""
