"""Making and upgrading archsearch's tables: a new database gets them all, an older schema version
that differs only by what was added since is brought up to this code's in place, and a database
that holds another application's tables is refused.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import bindparam, inspect, select, text, update

from archsearch.errors import quoted
from archsearch.space.objectives import curve_change
from archsearch.storage import schema
from archsearch.storage.errors import StorageError
from archsearch.storage.records import study_proxy_seed
from archsearch.storage.schema import SCHEMA_VERSION

# The tables Optuna's RDB storage makes: a SQLite file holding only these (and archsearch's) may
# become an archsearch database; one holding any other table is another application's file.
_OPTUNA_TABLES = frozenset(
    {
        "alembic_version", "version_info", "studies", "study_directions", "study_user_attributes",
        "study_system_attributes", "trials", "trial_user_attributes", "trial_system_attributes",
        "trial_params", "trial_values", "trial_intermediate_values", "trial_heartbeats",
    }
)  # fmt: skip


def check_or_create(conn: Any, *, create: bool, read_only: bool, display_url: str, sqlite: bool) -> int:
    """The database's archsearch schema version, inside `conn`'s transaction: the tables made
    (`create`) or brought up to this code's version (a writer, from an additive version),
    and then this code's version.

    Raises:
        StorageError: no archsearch database there (without `create`), or a foreign table
            of archsearch's name.
    """
    tables = set(conn.dialect.get_table_names(conn))
    if schema.Meta.__tablename__ not in tables:
        if not create:
            raise StorageError(f"{display_url} holds no archsearch database")
        others = sorted(t for t in tables if t not in _OPTUNA_TABLES and not t.startswith("archsearch_"))
        if sqlite and others:  # a file is one application's: another's is not extended
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise StorageError(
                f"{display_url} holds no archsearch database but another application's tables "
                f"({shown}): give a new file as --storage"
            )
        if name := _not_optuna(conn, tables & _OPTUNA_TABLES):
            raise StorageError(
                f"{display_url} holds a table named {name!r} that is not Optuna's (it lacks "
                "Optuna's columns): another application's; give a new database as --storage"
            )
        schema.Base.metadata.create_all(conn)
        conn.execute(schema.Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
        return SCHEMA_VERSION
    row = conn.execute(
        select(schema.Meta.value).where(schema.Meta.key == "schema_version")
    ).scalar_one_or_none()
    try:
        found = int(row) if row is not None else 0
    except (TypeError, ValueError):
        raise StorageError(
            f"{display_url} holds no archsearch database: its {schema.Meta.__tablename__} table "
            f"gives the schema version {quoted(str(row))}, not a number"
        ) from None
    if schema.ADDITIVE_SINCE <= found < SCHEMA_VERSION and not read_only:
        # Those versions lack only tables added since: create them (existing tables are left
        # alone) and record the new version, in one transaction.
        schema.Base.metadata.create_all(conn, checkfirst=True)
        _add_columns(conn)
        if found < schema.LOSS_CHANGE_SINCE:
            _fill_loss_changes(conn)
        if found < schema.LADDER_BATCH_SINCE:
            _rebuild_ladder_rungs(conn)
        if found < schema.PROMOTION_SEED_SINCE:
            _rebuild_promotions(conn)
        conn.execute(
            update(schema.Meta.__table__)
            .where(schema.Meta.key == "schema_version")
            .values(value=str(SCHEMA_VERSION))
        )
        return SCHEMA_VERSION
    return found


def _not_optuna(conn: Any, names: set[str]) -> str | None:
    """The first of `names` (tables named as Optuna's) whose columns lack the keys of Optuna's table
    of that name, or None: another application's `studies` or `trials` table passed the name
    check, and a search would then create archsearch's and Optuna's tables beside it. The
    primary, foreign and unique keys have been the same in every Optuna schema, so an older Optuna's
    tables pass."""
    from optuna.storages._rdb import models

    expected = {
        t.name: {c.name for c in t.columns if c.primary_key or c.foreign_keys or c.unique}
        for t in models.BaseModel.metadata.sorted_tables
    }
    expected["alembic_version"] = {"version_num"}
    inspector = inspect(conn)
    for name in sorted(names):
        if not expected.get(name, set()) <= {c["name"] for c in inspector.get_columns(name)}:
            return name
    return None


def _add_columns(conn: Any) -> None:
    """Add the nullable columns of `schema.ADDED_COLUMNS` an older database's tables lack."""
    for table_name, column_name in schema.ADDED_COLUMNS:
        present = {c["name"] for c in conn.dialect.get_columns(conn, table_name)}
        if column_name in present:
            continue
        column = schema.Base.metadata.tables[table_name].c[column_name]
        kind = column.type.compile(dialect=conn.dialect)
        # Names and type from the schema module, never user text: DDL cannot bind parameters.
        conn.execute(text(f"ALTER TABLE {table_name} ADD COLUMN {column_name} {kind}"))


def _fill_loss_changes(conn: Any) -> None:
    """Fill `loss_change` (schema version 6) of an older database's trials from their stored
    held-out curves; a trial without one keeps NULL, which the loss objective reads as 0."""
    curves, trials = schema.Curve.__table__, schema.Trial.__table__
    rows = conn.execute(
        select(curves.c.trial_id, curves.c.tokens, curves.c.loss)
        .where(curves.c.kind == "val")
        .order_by(curves.c.trial_id, curves.c.tokens)
    )
    by_trial: dict[int, list[tuple[int, float]]] = {}
    for trial_id, tokens, loss in rows:
        by_trial.setdefault(trial_id, []).append((tokens, loss))
    if by_trial:
        conn.execute(
            update(trials).where(trials.c.id == bindparam("trial")).values(loss_change=bindparam("change")),
            [{"trial": t, "change": curve_change(curve)} for t, curve in by_trial.items()],
        )


# TrainSettings' default batch while schema versions 4-6 stored rungs: what a rung of theirs whose
# settings name no batch trained at (a fact of those versions, not today's default).
_V6_DEFAULT_BATCH = 16


def _rebuild_ladder_rungs(conn: Any) -> None:
    """Give an older database's ladder rungs their batch size (schema version 7), read from each
    row's stored settings (`_V6_DEFAULT_BATCH` where they name none), in the rebuilt table whose
    key includes it: a unique constraint cannot be altered on SQLite. The rows are read, the table
    dropped (its index and id sequence with it) and made again, in the caller's transaction."""
    table = schema.LadderRung.__table__
    old = [c["name"] for c in conn.dialect.get_columns(conn, table.name)]
    if "batch_size" in old:  # made by `create_all` just now, from an older version without ladders
        return
    rows = [dict(r) for r in conn.execute(text(f"SELECT * FROM {table.name}")).mappings()]
    table.drop(conn)
    table.create(conn)
    for row in rows:
        row.pop("id")
        try:
            batch = json.loads(row["settings_json"]).get("batch_size")
        except (ValueError, AttributeError):
            batch = None
        row["batch_size"] = batch if isinstance(batch, int) and batch > 0 else _V6_DEFAULT_BATCH
    if rows:
        conn.execute(table.insert(), rows)


def _rebuild_promotions(conn: Any) -> None:
    """Give an older database's promotions their seed (schema version 11): each was trained at its
    study's proxy seed (`study_proxy_seed`), the only seed a promotion had, in the rebuilt table
    whose key includes it (a unique constraint cannot be altered on SQLite). As
    `_rebuild_ladder_rungs`: read, dropped, made again, in the caller's transaction; the rows keep
    their order and get new ids, so the id sequence of PostgreSQL stays ahead of them."""
    table = schema.Promotion.__table__
    if "seed" in {c["name"] for c in conn.dialect.get_columns(conn, table.name)}:
        return  # made by `create_all` just now, from an older version without promotions
    rows = [dict(r) for r in conn.execute(text(f"SELECT * FROM {table.name} ORDER BY id")).mappings()]
    studies = schema.Study.__table__
    seeds: dict[str, int] = {}
    for name, spec_json in conn.execute(select(studies.c.name, studies.c.spec_json)):
        try:
            seeds[name] = study_proxy_seed(json.loads(spec_json))
        except (TypeError, ValueError):
            seeds[name] = 0
    table.drop(conn)
    table.create(conn)
    for row in rows:
        row.pop("id")
        row["seed"] = seeds.get(row["study"], 0)
    if rows:
        conn.execute(table.insert(), rows)
