"""Stored rows that are not what their columns hold, beyond the trials table: a
study row's time, loss rule or JSON, a profile's or a device's JSON of another shape, a kernel
time that is text or negative; and numbers JSON cannot carry. Each was a traceback or a silent
nonsense result; each is now the damaged-database line, exit 1, with the file left as it was.
Also: another application's SQLite file is not extended with archsearch's tables."""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import DamagedStorageError, Storage, StorageError
from tests.helpers import one_line
from tests.storage.test_query import fill_study


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _study(tmp_path: Path, *statements: tuple[str, tuple]) -> tuple[Path, str]:
    """A filled study's SQLite file, with `statements` run on it afterwards as another program would."""
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
        slot = db.claim_trial("s", 100, lease_s=60)  # a trial, and a device
        db.assign_trial(slot, number=99, optuna_trial_id=99, params={}, config=None)
        db.add_measurements(
            [
                {
                    "key": "k",
                    "fingerprint": "f",
                    "dtype": "fp32",
                    "kind": "gemm",
                    "shape": "1x1x1",
                    "seconds": 1e-3,
                }
            ],
            {"fingerprint": "f", "name": "cpu", "type": "cpu"},
        )
    with sqlite3.connect(path) as conn:
        conn.execute(  # every trial profiled: `report` reads the knee's
            "INSERT INTO archsearch_profiles SELECT id, 'h100-sxm', 1, 'bf16', 8, 0.01, 1000.0, '{}' "
            "FROM archsearch_trials"
        )
        for sql, args in statements:
            conn.execute(sql, args)
    conn.close()
    return path, f"sqlite:///{path}"


DAMAGED_STUDY_ROWS = {  # column, stored value, what the line says
    "created-at-text": (
        "created_at", "yesterday", "the created_at of study 's' is 'yesterday', not a number"
    ),
    "extrapolate-nan": (
        "spec_json", json.dumps({"extrapolate": math.nan}),
        "the spec of study 's' gives extrapolate 'nan', not a finite number >= 0",
    ),
    "size-beta-text": (
        "spec_json", json.dumps({"size_beta": "x"}),
        "the spec of study 's' gives size_beta 'x', not a finite number >= 0",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("column", "stored", "why"), DAMAGED_STUDY_ROWS.values(), ids=DAMAGED_STUDY_ROWS.keys()
)
@pytest.mark.parametrize("command", [["studies"], ["pareto", "--study", "s"], ["trials", "--study", "s"]])
def test_a_damaged_study_row_is_a_damaged_database_and_left_as_it_was(tmp_path, column, stored, why, command):
    """`studies` (created_at text: `time.localtime`) and `pareto` (a loss rule that is not
    a number) ended in tracebacks."""
    path, url = _study(tmp_path, (f"UPDATE archsearch_studies SET {column} = ?", (stored,)))
    before = _digest(path)
    result = CliRunner().invoke(app, [*command, "--storage", url])
    assert one_line(result, 1) == (
        f"error: the database {url} is damaged (a stored value is damaged: {why}): restore it from a "
        "copy, or give another --storage"
    )
    assert _digest(path) == before


JSON_OF_ANOTHER_SHAPE = {  # table, column, what the line names
    "profile-report": (
        "archsearch_profiles",
        "report_json",
        "trial 8's profile on 'h100-sxm' is not a JSON object",
    ),
    "device-info": ("archsearch_devices", "info_json", "device 'f' is not a JSON object"),
}


@pytest.mark.parametrize(
    ("table", "column", "why"), JSON_OF_ANOTHER_SHAPE.values(), ids=JSON_OF_ANOTHER_SHAPE.keys()
)
def test_json_of_another_shape_in_any_table_is_a_damaged_database(tmp_path, table, column, why):
    """A profile's report or a device's info stored as a JSON list was an AttributeError
    or TypeError traceback in `report`."""
    path, url = _study(tmp_path, (f"UPDATE {table} SET {column} = '[1]'", ()))
    with Storage.open(url, read_only=True) as db:
        trial_id = next(r.id for r in db.trials("s") if r.number == 99)
    before = _digest(path)
    with Storage.open(url, read_only=True) as db, pytest.raises(DamagedStorageError) as info:
        db.profiles(trial_id) if table == "archsearch_profiles" else db.devices()
    assert str(info.value) == (
        f"the database {url} is damaged (a stored value is damaged: {why.replace('8', str(trial_id))}): "
        "restore it from a copy, or give another --storage"
    )
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", "--study", "s", "-o", str(out), "--storage", url])
    one_line(result, 1, "is damaged (a stored value is damaged: ", "is not a JSON object")
    assert _digest(path) == before and not out.exists()


@pytest.mark.parametrize(("stored", "shown"), [("x", "'x'"), (-1.0, "'-1.0'")], ids=["text", "negative"])
def test_a_stored_kernel_time_that_is_not_a_positive_number_is_a_damaged_database(tmp_path, stored, shown):
    """`profile --storage` read a kernel time stored as text (a traceback) or negative
    (a 'measured matmul peak' of -2e9 FLOP/s and an MFU clamped to 1)."""
    path, url = _study(tmp_path, ("UPDATE archsearch_kernels SET seconds = ?", (stored,)))
    before = _digest(path)
    with Storage.open(url, read_only=True) as db, pytest.raises(DamagedStorageError) as info:
        db.measurements()
    assert f"kernel 'k' took {shown} s, not a positive number" in str(info.value)
    assert "\n" not in str(info.value) and _digest(path) == before


def test_another_application_s_sqlite_file_is_not_given_archsearch_s_tables(tmp_path):
    """`profile --storage` (which creates the database it is given) added archsearch's
    tables to another application's SQLite file, exit 0. A file with Optuna's tables only, or an
    empty one, still becomes an archsearch database."""
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER, total REAL)")
    conn.close()
    before = _digest(path)
    with pytest.raises(StorageError) as info:
        Storage.open(f"sqlite:///{path}")
    assert str(info.value) == (
        f"sqlite:///{path} holds no archsearch database but another application's tables (orders): give a "
        "new file as --storage"
    )
    assert _digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    Storage.open(f"sqlite:///{empty}").close()  # an empty file is a new database


# --- numbers JSON has no words for ---------------------------------------------------------------------
def test_an_infinite_stored_value_is_null_in_the_trials_json(tmp_path):
    """`trials --format json` ended in a ValueError traceback ('Out of range float
    values are not JSON compliant') on a stored +-inf, which the database keeps (a failed trial's
    bits per byte)."""
    _, url = _study(tmp_path, ("UPDATE archsearch_trials SET bits_per_byte = 9e999 WHERE number = 0", ()))
    result = CliRunner().invoke(app, ["trials", "--study", "s", "--format", "json", "--storage", url])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)  # strict JSON: no Infinity token
    assert next(r for r in rows if r["number"] == 0)["bits_per_byte"] is None


def test_a_reference_point_whose_hypervolume_overflows_is_refused(tmp_path):
    """`pareto --reference 1e308,1e308` printed numpy's RuntimeWarning and a hypervolume
    of inf (`"hypervolume": Infinity` with --json, which strict JSON parsers refuse), exit 0."""
    _, url = _study(tmp_path)
    result = CliRunner().invoke(
        app, ["pareto", "--study", "s", "--reference", "1e308,1e308", "--json", "--storage", url]
    )
    assert one_line(result, 2) == (
        "error: the hypervolume against the reference point (1e+308, 1e+308) overflows a float: give a "
        "reference nearer the front"
    )
    assert result.stdout == ""


def test_a_reference_point_no_trial_beats_says_why_the_hypervolume_is_0(tmp_path):
    """`pareto --reference 0,0` printed hypervolume 0, exit 0, with nothing to say why."""
    _, url = _study(tmp_path)
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--reference", "0,0", "--storage", url])
    assert result.exit_code == 0, result.output
    assert "hypervolume 0 against reference (0, 0)" in result.stdout
    assert result.stderr.startswith("note: no trial of the front is better than the reference point")


# --- damage that was blamed on the input ----- ---------------------------------------------
@pytest.mark.parametrize("command", [["pareto", "--study", "s"], ["report", "--study", "s", "-o", "r.html"]])
def test_an_infinite_objective_of_a_complete_trial_is_a_damaged_database(tmp_path, command):
    """A complete trial's loss set to inf by hand made `pareto` blame the default reference
    point (`give a reference nearer the front`), exit 2: the input's fault, which it was not."""
    path, url = _study(tmp_path, ("UPDATE archsearch_trials SET loss = 9e999 WHERE number = 0", ()))
    before = _digest(path)
    command = [str(tmp_path / c) if c.endswith(".html") else c for c in command]
    result = CliRunner().invoke(app, [*command, "--storage", url])
    assert one_line(result, 1) == (
        f"error: the database {url} is damaged (complete trial 0 of 's' stores loss = inf, which no "
        "complete trial has): restore it from a copy, or give another --storage"
    )
    assert _digest(path) == before and not (tmp_path / "r.html").exists()


def test_stored_objectives_no_study_could_have_are_a_damaged_database(tmp_path):
    """A study row's objectives 'foo,bar' were reported as bad input (exit 2), as if the
    user had typed them."""
    path, url = _study(tmp_path, ("UPDATE archsearch_studies SET objectives = 'foo,bar'", ()))
    before = _digest(path)
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--storage", url])
    line = one_line(result, 1)
    assert line == (
        f"error: the database {url} is damaged (a stored value is damaged: the stored objectives of study "
        "'s' name 'foo', which is no objective): restore it from a copy, or give another --storage"
    )
    assert _digest(path) == before
