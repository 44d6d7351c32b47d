"""What `lith.principal` takes from the app's identity dependency (`fastapi_lith.web.identity`):
a principal's id, a `str` or an `int`, or None for nobody signed in; anything else is the app's
bug, named with what the dependency returned. The dependency in a served app:
tests/web/test_server_fields.py and tests/app/test_members.py."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from fastapi_lith.web.identity import IdentityError, asked, principal_dependency


def current_user() -> object:
    """The app's identity dependency; the tests hand `lith.principal` its answer."""
    return None


class SessionUser:
    """An identity dependency that is a callable object, named by its repr."""

    def __call__(self) -> object:
        return None

    def __repr__(self) -> str:
        return "SessionUser()"


@pytest.mark.parametrize("who", ["ada", 7, None])
async def test_a_principals_id_or_nobody_is_the_principal_and_remembered_for_the_request(who: str | int | None) -> None:
    principal = principal_dependency(current_user)
    assert asked() is None  # not asked yet in this request
    assert await principal(who=who) == who
    assert asked() == (who,)


@pytest.mark.parametrize(
    ("identity", "named", "who", "kind"),
    [
        (current_user, "'current_user'", {"id": "ada"}, "dict"),
        (current_user, "'current_user'", True, "bool"),
        (current_user, "'current_user'", 7.0, "float"),
        (SessionUser(), "SessionUser()", ["ada"], "list"),
    ],
)
async def test_an_identity_that_returns_no_principals_id_is_the_apps_bug_named_with_what_it_returned(
    identity: Callable[..., object], named: str, who: object, kind: str
) -> None:
    principal = principal_dependency(identity)
    with pytest.raises(IdentityError, match=re.escape(
        f"identity {named} returned {kind}: it must return the principal's id (a str or an int), "
        "or None for nobody signed in"
    )):  # fmt: skip
        await principal(who=who)
    assert asked() is None


async def test_without_an_identity_everyone_is_nobody() -> None:
    anonymous = principal_dependency(None)
    assert await anonymous() is None
    assert asked() == (None,)
