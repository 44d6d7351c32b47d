"""Signing in: a name and a password, and a signed session cookie that says who is asking.

`signed_in` is the app's identity, `Lith(identity=signed_in)`: the library asks it on every
stream connect and reconnect, and for every `FromServer()` field of a command. Starlette's
`SessionMiddleware` signs the cookie (itsdangerous) with the app's secret; a password is kept
only as its scrypt hash. The pages are plain HTML forms: they work before Datastar loads, and
password managers know them.

This file is the same in the project template (`python -m fastapi_lith new`) and in
examples/todos; a test keeps the two equal.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated

import anyio
import htpy as h
import sqlalchemy as sa
from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import StringConstraints, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from fastapi_lith import Command, Lith, Rejected, Tx

person = sa.table("person", sa.column("id"), sa.column("name"), sa.column("salt"), sa.column("password_hash"))
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=40, pattern=r"^\w+$")]
MIN_PASSWORD = 8


def signed_in(request: Request) -> int | None:
    """Who is asking: the person the session cookie names, or None."""
    who = request.session.get("person")
    return who if isinstance(who, int) else None


class SignUp(Command):
    """A new person; refused if the name is taken (names compare without case)."""

    name: Name
    salt: bytes
    password_hash: bytes

    def apply(self, tx: Tx) -> int:
        if tx.scalar(sa.select(person.c.id).where(person.c.name == self.name)) is not None:
            raise Rejected("That name is taken: choose another.")
        row = {"name": self.name, "salt": self.salt, "password_hash": self.password_hash}
        return int(tx.execute(person.insert().values(**row)).lastrowid)


async def scrypt(password: str, salt: bytes) -> bytes:
    """A slow hash on purpose, off the loop: a copied table does not give the passwords back."""
    return await anyio.to_thread.run_sync(
        lambda: hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)
    )


def signin_page(title: str, style: str, message: str = "") -> str:
    return str(h.html(lang="en")[
        h.head[h.meta(charset="utf-8"), h.title[f"Sign in: {title}"], h.style[style]],
        h.body[
            h.h1[title],
            message and h.p(".lith-error", role="alert")[message],
            h.form(method="post", action="/signin")[
                h.input(name="name", aria_label="name", placeholder="name", required=True, autocomplete="username"),
                h.input(name="password", type="password", aria_label="password", placeholder="password",
                        required=True, autocomplete="current-password"),
                h.button["Sign in"], h.button(formaction="/signup")["Sign up"],
            ],
        ],
    ])


def signin_routes(lith: Lith, *, title: str, style: str = "") -> APIRouter:
    """`GET/POST /signin`, `POST /signup` and `POST /signout`, each refusing another site's form."""
    router = APIRouter(include_in_schema=False)
    same_site = [Depends(lith.same_origin)]

    def refused(message: str) -> Response:
        return HTMLResponse(signin_page(title, style, message), status_code=400)

    @router.get("/signin", response_class=HTMLResponse)
    async def signin_form() -> str:
        return signin_page(title, style)

    @router.post("/signin", dependencies=same_site)
    async def signin(
        request: Request, name: str = Form(max_length=40), password: str = Form(max_length=200),
        db: AsyncConnection = Depends(lith.db),
    ) -> Response:
        row = (await db.execute(sa.select(person).where(person.c.name == name))).mappings().first()
        # The hash runs for an unknown name too, so the answer's time does not say who exists.
        given = await scrypt(password, row["salt"] if row is not None else secrets.token_bytes(16))
        if row is None or not hmac.compare_digest(given, row["password_hash"]):
            return refused("That name and password do not match.")
        request.session["person"] = row["id"]
        return RedirectResponse("/", status_code=303)

    @router.post("/signup", dependencies=same_site)
    async def signup(
        request: Request, name: str = Form(max_length=40), password: str = Form(max_length=200)
    ) -> Response:
        if len(password) < MIN_PASSWORD:
            return refused(f"Choose a password of {MIN_PASSWORD} characters or more.")
        salt = secrets.token_bytes(16)
        try:
            new = SignUp(name=name, salt=salt, password_hash=await scrypt(password, salt))
        except ValidationError:
            return refused("A name is 1 to 40 letters, digits or _.")
        try:
            request.session["person"] = await lith.writer.do(new)
        except Rejected as exc:
            return refused(str(exc))
        return RedirectResponse("/", status_code=303)

    @router.post("/signout", dependencies=same_site)
    async def signout(request: Request) -> Response:
        who = request.session.pop("person", None)
        if who is not None:
            await lith.revoke(who)  # every tab of theirs stops now; a reconnect finds nobody signed in
        return RedirectResponse("/signin", status_code=303)

    return router
