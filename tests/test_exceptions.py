"""Every error the library raises is a `LithError` from fastapi_lith.exceptions, and keeps the
built-in base an app's `except ValueError` (or `RuntimeError`, `TypeError`) already catches."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import fastapi_lith
from fastapi_lith import exceptions
from tests.support import REPO

ROOT = REPO
# What a recipe or an example may import besides `fastapi_lith` itself.
PUBLIC_SUBPACKAGES = {"fastapi_lith.ops", "fastapi_lith.testing"}


def test_every_error_is_a_lith_error_exported_from_the_package() -> None:
    errors = [c for c in vars(exceptions).values() if inspect.isclass(c) and issubclass(c, BaseException)]
    assert len(errors) > 20
    for error in errors:
        assert issubclass(error, exceptions.LithError), error
        assert getattr(fastapi_lith, error.__name__) is error, error
        assert error.__name__ in fastapi_lith.__all__, error


def test_errors_defined_elsewhere_before_are_the_same_classes_there() -> None:
    from fastapi_lith import ops
    from fastapi_lith.engine import commands
    from fastapi_lith.ops import litestream
    from fastapi_lith.scaffold import ProjectError

    assert ops.BackupError is fastapi_lith.BackupError
    assert ops.InUse is fastapi_lith.InUse and issubclass(ops.InUse, ops.BackupError)
    assert ops.ReplicaError is litestream.ReplicaError is fastapi_lith.ReplicaError
    assert commands.Rejected is fastapi_lith.Rejected
    assert ProjectError is fastapi_lith.ProjectError


def test_a_bad_setting_or_argument_is_a_setting_error_and_still_a_value_error(tmp_path: Path) -> None:
    from fastapi_lith import delegate, form_fields, tab_signals
    from fastapi_lith.ops import Backups, Replica, backup
    from fastapi_lith.ops.replica_check import ReplicaChecks

    db_path = tmp_path / "app.db"
    fastapi_lith.open_sqlite(db_path).close()
    bad = [
        lambda: Backups(db_path, tmp_path, every=0.5),
        lambda: Backups(db_path, tmp_path, keep=0),
        lambda: backup(db_path, tmp_path / "copy.db", method="rsync"),  # type: ignore[arg-type]
        lambda: Replica(db_path, f"file://{tmp_path}/replica", sync_interval=0.1),
        lambda: ReplicaChecks(Replica(db_path, f"file://{tmp_path}/replica", check_every=None), every=0.5),
        lambda: tab_signals("not a tab!"),
        lambda: form_fields("not a tab!"),
        lambda: delegate("/move", "card-id"),
        lambda: delegate("/move", "data-card-id", card_id="1"),
        lambda: fastapi_lith.make_encoder("compress"),
        lambda: fastapi_lith.BrotliEncoder(quality=12),
        lambda: fastapi_lith.ZstdEncoder(window_log=99),
    ]
    for make in bad:
        with pytest.raises(fastapi_lith.SettingError) as caught:
            make()
        assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("name", ["zstd", "br", "gzip"])
def test_a_closed_encoder_says_so_as_a_runtime_error(name: str) -> None:
    encoder = fastapi_lith.make_encoder(name)
    encoder.encode(b"data: one\n\n")
    encoder.close()
    with pytest.raises(fastapi_lith.EncoderClosed) as caught:
        encoder.encode(b"data: two\n\n")
    assert isinstance(caught.value, RuntimeError)


def test_an_async_apply_is_a_command_error_and_still_a_type_error() -> None:
    with pytest.raises(fastapi_lith.CommandError, match="async def") as caught:

        class Sleepy(fastapi_lith.Command):
            async def apply(self, tx: fastapi_lith.Tx) -> None: ...

    assert isinstance(caught.value, TypeError)


def test_recipes_and_examples_import_only_public_modules() -> None:
    private = []
    for path in sorted([*(ROOT / "docs" / "src").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            )
            for name in names:
                if name.startswith("fastapi_lith.") and not any(
                    name == p or name.startswith(p + ".") for p in PUBLIC_SUBPACKAGES
                ):
                    private.append(f"{path.relative_to(ROOT)}: {name}")
    assert private == []
