"""`Depends(lith.body(Command))`: a command from the client's body and the server's own fields.

A field marked `FromServer()` (engine/commands.py) is filled from a FastAPI dependency, the
request's principal by default, so a page cannot say who sent a command. The client's part is
the command's other fields: that is the body OpenAPI shows. A body that sends a server field
anyway is refused (422, naming the field) rather than ignored: a page that believed it set the
owner would be wrong in silence, and a client probing what it may set learns so at once.

The command is validated once, by its own class, from the client's fields and the server's
values together, so its validators see it whole. The body may be JSON (`send()`) or a form,
urlencoded or multipart (`send_form()`), read as FastAPI reads `Form()` fields. The dependency
takes the writer first, so a route that takes the body is a guarded command route (body limit,
same origin, HTML errors pushed to the acting tab) and a cross-site request is refused before
the app's identity runs. Its refusals are FastAPI's `RequestValidationError`, which the guard
answers as any other 422.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import cache
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Body, Depends
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, PlainValidator, ValidationError, create_model
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..engine.commands import Command, FromServer, server_fields
from ..exceptions import CommandError
from .guard import MaxBody, media_type

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
SIGN_IN = "Sign in to do this: nobody is signed in."
SET_BY_SERVER = "The server sets this field: a request cannot send it"


class CommandBodies:
    """`lith.body`: per command class, the dependency that gives a validated command.

    Over one web layer: its writer dependency (the guard's marker) and its principal, the
    default server dependency. Made once per class, so `lith.body(Cmd)` is the same object
    each time (FastAPI runs it once per request, and `dependency_overrides` can name it).
    """

    def __init__(self, writer: Callable[..., Any], principal: Callable[..., Any]) -> None:
        self.writer = writer
        self.principal = principal
        self._made: dict[type[Command], Callable[..., Any]] = {}
        # Each `lith.command` endpoint and its command: the guard serves those directly.
        self.endpoints: dict[Callable[..., Any], type[Command]] = {}

    def __call__(self, command: type[Command]) -> Callable[..., Any]:
        made = self._made.get(command)
        if made is None:
            if not (isinstance(command, type) and issubclass(command, Command)):
                raise CommandError(f"lith.body takes a Command class, not {command!r}")
            made = self._made[command] = self._dependency(command)
        return made

    def endpoint(self, command: type[Command], max_body: int | None = None) -> Callable[..., Any]:
        """The endpoint of `lith.command`: the body as `command`, applied by the writer, 204.

        A `Rejected` goes to the guard's handler, the one rule for every command route:
        204 for a tab command, 409 with the message for any other. `max_body`, if given, is
        the route's own body limit (a `MaxBody` among its dependencies).
        """

        async def endpoint(lith_writer: Any, cmd: Command, lith_limit: Any = None) -> Response:
            await lith_writer.do(cmd)
            return Response(status_code=204)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [
            inspect.Parameter("lith_writer", kind, default=Depends(self.writer), annotation=Any),
            inspect.Parameter("cmd", kind, default=Depends(self(command)), annotation=Any),
        ]
        if max_body is not None:
            params.append(inspect.Parameter("lith_limit", kind, default=Depends(MaxBody(max_body)), annotation=Any))
        endpoint.__signature__ = inspect.Signature(params, return_annotation=Response)  # type: ignore[attr-defined]
        endpoint.__name__ = endpoint.__qualname__ = command.__name__
        self.endpoints[endpoint] = command
        return endpoint

    def _dependency(self, command: type[Command]) -> Callable[..., Any]:
        server = server_fields(command)
        keys = {name: _input_key(command, name) for name in server}
        refused = {sent: name for name in server for sent in _names(command, name)}
        sequences = {
            _input_key(command, name) for name, field in command.model_fields.items()
            if name not in server and _sequence(field.annotation)
        }

        async def body(request: Request, lith_writer: Any, sent: Any, **values: Any) -> Command:
            # FastAPI parsed a JSON body; bytes may be a form, which it reads only for `Form()`.
            is_form = isinstance(sent, bytes) and media_type(request.headers.get("content-type")) in FORMS
            form = await request.form() if is_form else None
            try:
                fields = _form_fields(form, sequences) if form is not None else sent
                if not isinstance(fields, Mapping):
                    raise RequestValidationError(
                        [{"type": "model_attributes_type", "loc": ("body",), "input": fields,
                          "msg": "Input should be a valid dictionary or object to extract fields from"}],
                        body=fields,
                    )
                sent_server = {name: fields[key] for key, name in refused.items() if key in fields}
                if sent_server:
                    raise RequestValidationError(
                        [{"type": "set_by_server", "loc": ("body", name), "input": value, "msg": SET_BY_SERVER}
                         for name, value in sent_server.items()],
                        body=fields,
                    )
                given = {keys[name]: values[f"server_{i}"] for i, name in enumerate(server)}
                try:
                    return command.model_validate({**fields, **given})
                except ValidationError as exc:
                    raise _refusal(command, exc, server, given, keys, fields) from None
            finally:
                if form is not None:
                    await form.close()

        kind = inspect.Parameter.KEYWORD_ONLY  # FastAPI passes keywords: any order is a valid one
        # `sent` is the client's part as the route receives it: JSON parsed by FastAPI, or a
        # form's bytes (read again as a form above). Its schema, for OpenAPI, is the client model.
        sent = Annotated[Any, PlainValidator(lambda value: value, json_schema_input_type=client_model(command)), Body()]
        params = [
            inspect.Parameter("request", kind, annotation=Request),
            # The writer first: the same-origin check and the guard come before anything else.
            inspect.Parameter("lith_writer", kind, default=Depends(self.writer), annotation=Any),
            *(
                inspect.Parameter(f"server_{i}", kind, annotation=Any, default=Depends(
                    marker.dependency if marker.dependency is not None else self.principal
                ))
                for i, marker in enumerate(server.values())
            ),
            inspect.Parameter("sent", kind, annotation=sent),
        ]
        body.__signature__ = inspect.Signature(params, return_annotation=command)  # type: ignore[attr-defined]
        body.__name__ = body.__qualname__ = f"{command.__name__}_body"
        return body


def _refusal(
    command: type[Command], exc: ValidationError, server: Mapping[str, FromServer],
    given: Mapping[str, Any], keys: Mapping[str, str], fields: Any,
) -> Exception:
    """The answer to a command that failed validation: the client's fields are a 422; a server
    field is none of the client's doing, so the principal missing is a 401 (sign in) and any
    other server value the field refuses is the app's bug."""
    by_key = {key: name for name, key in keys.items()}
    errors = exc.errors(include_url=False)
    for error in errors:
        loc = error.get("loc", ())
        name = by_key.get(loc[0]) if loc and isinstance(loc[0], str) else None
        if name is None:
            continue
        marker = server[name]
        if marker.dependency is None and given[keys[name]] is None:
            return HTTPException(401, SIGN_IN)
        return CommandError(
            f"{command.__qualname__}.{name} is {marker!r}, whose value {given[keys[name]]!r} it refuses: "
            f"{error.get('msg')}"
        )
    return RequestValidationError([{**e, "loc": ("body", *e.get("loc", ()))} for e in errors], body=fields)


def _form_fields(form: FormData, sequences: set[str]) -> dict[str, Any]:
    """A form's fields as FastAPI reads `Form()` ones: an empty field (an HTML form sends every
    input) counts as not sent, so the field's default applies; a list field takes every value."""
    fields: dict[str, Any] = {}
    for key in form:
        values = [v for v in form.getlist(key) if v != "" and not (isinstance(v, UploadFile) and not v.filename)]
        if values:
            fields[key] = values if key in sequences else values[-1]
    return fields


# -- what the client may send -------------------------------------------------------------------


@cache
def client_model(command: type[Command]) -> type[BaseModel]:
    """The body a client may send `command`, for OpenAPI: its fields but the server's, made
    once per class. Only a schema: the command's own class validates what is sent."""
    server = server_fields(command)
    config = command.model_config.copy()
    config.pop("title", None)
    fields: dict[str, Any] = {
        name: (field.annotation, field) for name, field in command.model_fields.items() if name not in server
    }
    return create_model(
        f"{command.__name__}Body", __config__=config, __doc__=command.__doc__, __module__=command.__module__,
        **fields,
    )


def _names(command: type[Command], name: str) -> set[str]:
    """Every key a client could name a field by: its name and its aliases."""
    field = command.model_fields[name]
    return {name} | {a for a in (field.alias, field.validation_alias) if isinstance(a, str)}


def _input_key(command: type[Command], name: str) -> str:
    """The key validation reads a field from: its alias, unless the command validates by name."""
    field = command.model_fields[name]
    if command.model_config.get("validate_by_alias", True) is False:
        return name
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    return alias or name


def _sequence(annotation: Any) -> bool:
    """Whether a form may send the field several times (`list[str]`, `set[int] | None`)."""
    origin = get_origin(annotation)
    if origin is Union or origin is UnionType:
        return any(_sequence(arg) for arg in get_args(annotation) if arg is not NoneType)
    return (origin or annotation) in (list, set, frozenset, tuple)
