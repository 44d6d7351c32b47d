"""The web layer: FastAPI routes, dependencies, guards and HTML answers over the engine."""
