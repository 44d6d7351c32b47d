"""Two ways to choose a stream's encoder: force one, or negotiate with your own list."""

from fastapi import FastAPI

from fastapi_lith import Lith

# --8<-- [start:imports]
from fastapi import Header, HTTPException

from fastapi_lith import BrotliEncoder, Encoder, make_encoder, negotiate
# --8<-- [end:imports]

lith = Lith("app.db")
app = FastAPI()
app.include_router(lith.router)


def force_gzip() -> None:
    # --8<-- [start:force]
    from fastapi_lith import GzipEncoder

    app.dependency_overrides[lith.encoder] = lambda: GzipEncoder()
    # --8<-- [end:force]


# --8<-- [start:negotiate]
def encoder(accept_encoding: str | None = Header(None)) -> Encoder:
    name = negotiate(accept_encoding, available=("br", "gzip", "identity"))
    if name is None:
        raise HTTPException(406, "no acceptable Content-Encoding")
    if name == "br":
        return BrotliEncoder(size_hint=200_000)   # size the window for the largest frame
    return make_encoder(name)


app.dependency_overrides[lith.encoder] = encoder
# --8<-- [end:negotiate]
