"""The web layer (fastapi_lith/web/): the guard, origin, headers and forms, over HTTP."""
