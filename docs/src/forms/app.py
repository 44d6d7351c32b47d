"""An upload from a page: a form Datastar posts as multipart, a route with its own body limit."""

from pathlib import Path

import htpy as h
from fastapi import Depends, FastAPI, Form, UploadFile
from fastapi.responses import HTMLResponse
from pydantic import Field

from fastapi_lith import (
    Db,
    Lith,
    MaxBody,
    Rejected,
    TabCommand,
    Tx,
    Writer,
    form_fields,
    new_tab,
    pending,
    send_form,
    tab_signals,
)

lith = Lith("photos.db", migrations=Path(__file__).parent / "migrations")
app = FastAPI()
app.include_router(lith.router)


class AddPhoto(TabCommand):
    caption: str = Field(min_length=1, max_length=80)
    name: str
    size: int

    def apply(self, tx: Tx) -> None:
        if tx.first("SELECT 1 FROM photo WHERE name = :name", {"name": self.name}):
            raise Rejected(f"{self.name} is here already, so nothing changed.")
        tx.execute("INSERT INTO photo (name, caption, size) VALUES (:name, :caption, :size)",
                   {"name": self.name, "caption": self.caption, "size": self.size})
        tx.touch("photos")
        self.say(f"Added {self.caption}.")


# --8<-- [start:route]
@app.post("/photos", status_code=204, dependencies=[Depends(MaxBody(8 * 2**20))])
async def add_photo(
    photo: UploadFile,
    caption: str = Form(),
    tab: str = Form(),
    op: int = Form(0),
    writer: Writer = Depends(lith.writer),
) -> None:
    data = await photo.read()  # slow work (a resize, a scan) here, before the writer
    await writer.do(AddPhoto(tab=tab, op=op, caption=caption, name=photo.filename or "photo", size=len(data)))
# --8<-- [end:route]


@lith.view("photos", topics={"photos"})
def photos(db: Db) -> h.Element:
    return h.ul("#photos")[(h.li[row["caption"]] for row in db.all("SELECT caption FROM photo ORDER BY id"))]


# --8<-- [start:page]
@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    tab = new_tab()
    return str(h.html[h.body(tab_signals(tab), data_init=lith.connect("photos", "outcome/{tab}", tab=tab))[
        lith.datastar(),
        h.form({"data-on:submit": send_form("/photos")}, enctype="multipart/form-data")[
            form_fields(tab),  # first, before the file: a body cut off at the limit still names its tab
            h.input(name="caption", aria_label="caption"),
            h.input(type="file", name="photo", accept="image/*", aria_label="photo"),
            h.button(pending())["Upload"],
        ],
        await lith.render("photos"),
        await lith.render("outcome/{tab}", tab=tab),
    ]])
# --8<-- [end:page]
