"""The filter language and `trials_frame`, on SQLite and PostgreSQL (see conftest.backend_url)."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from archsearch.errors import UnknownNameError
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.storage.query import (
    ALIASES,
    COLUMNS,
    FRAME_COLUMNS,
    MAX_DEPTH,
    QueryError,
    compile_filter,
    trials_frame,
)
from archsearch.storage.schema import Trial
from archsearch.trial import TrialOutcome
from tests.postgres import postgres_database

SPEC = dict(spec_fingerprint="f" * 64, spec_source="[model]\n", spec={}, objectives=("loss", "flops"))


def _cfg(d_model: int, n_layers: int, activation: str, bias: bool = False):
    return config_from_knobs(
        d_model=d_model, n_layers=n_layers, activation=activation, bias=bias, vocab_size=256, seq_len=64
    )


# number -> (config, status, loss, reason, step-time device); trial 5 was rejected before it had
# a shape, trial 6 is still running.
TRIALS = {
    0: (_cfg(128, 2, "swiglu"), "complete", 2.0, None, "h100-sxm"),
    1: (_cfg(256, 4, "gelu", bias=True), "complete", 1.8, None, None),
    2: (_cfg(512, 4, "swiglu"), "complete", 1.5, None, "h100-sxm"),
    3: (_cfg(768, 6, "relu"), "pruned", 2.5, "dominated at rung 0.25", None),
    4: (_cfg(1024, 8, "swiglu"), "failed", None, "out of memory", None),
    5: (None, "rejected", None, "params above the budget", None),
    6: (_cfg(384, 4, "geglu"), "running", None, None, None),
}


def fill_study(storage: Storage, study: str = "s") -> None:
    """`TRIALS` recorded through the search's own life cycle: claim, assign, finish or end."""
    storage.create_study(study, **SPEC)
    for number, (cfg, status, loss, reason, device) in TRIALS.items():
        slot = storage.claim_trial(study, 100, lease_s=60)
        storage.assign_trial(slot, number=number, optuna_trial_id=number, params={"n": number}, config=cfg)
        if status == "rejected":
            storage.end_trial(slot, status, reason)
        elif status != "running":
            train = {"val_loss": loss, "tokens": 4096, "steps": 2} if loss is not None else None
            step = (1e-3 * (number + 1), device) if device else (None, None)
            storage.finish_trial(
                slot,
                TrialOutcome(status, reason, train, step_time_s=step[0], step_time_device=step[1]),
            )


@pytest.fixture
def storage(backend_url):
    """A filled study of the test's own, for the tests that write to the database."""
    with Storage.open(backend_url) as st:
        fill_study(st)
        yield st


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def filled(request, tmp_path_factory):
    """One filled study per backend, shared by the module's tests that only read: filling one was
    most of each test's time (about 0.3 s on SQLite, 1 s on PostgreSQL)."""
    if request.param == "sqlite":
        where = contextlib.nullcontext(f"sqlite:///{tmp_path_factory.mktemp('query') / 'trials.db'}")
    else:
        where = postgres_database()
    with where as url, Storage.open(url) as st:
        fill_study(st)
        yield st


def numbers(storage: Storage, where: str | None = None, **kwargs) -> list[int]:
    return [int(n) for n in trials_frame(storage, "s", where, **kwargs)["number"]]


def _matching(predicate) -> list[int]:
    return [n for n, (cfg, *_) in TRIALS.items() if cfg is not None and predicate(cfg)]


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("activation = swiglu", [0, 2, 4]),
        ("activation = swiglu and d_model >= 512 and status = complete", [2]),
        ("ACTIVATION == 'swiglu' AnD Status = complete", [0, 2]),
        ("d_model = 128 or activation = swiglu and d_model >= 512", [0, 2, 4]),  # and binds tighter
        ("(d_model = 128 or activation = swiglu) and d_model >= 512", [2, 4]),
        ("not activation = swiglu", [1, 3, 6]),  # trial 5 has no activation: null is not "not swiglu"
        ("not (d_model < 512 or status != complete)", [2]),
        ("not not d_model = 128", [0]),
        ("activation in (gelu, 'relu')", [1, 3]),
        ("activation not in (swiglu, geglu)", [1, 3]),
        ("trial in (1, 3, 99)", [1, 3]),
        ("reason is null", [0, 1, 2, 6]),
        ("loss is not null and d_model is not null", [0, 1, 2, 3]),
        ("d_model is null", [5]),
        ("params < 2M", _matching(lambda c: param_counts(c).total < 2_000_000)),
        ("params_total >= 1.5M", _matching(lambda c: param_counts(c).total >= 1_500_000)),
        ("flops >= 1e7", _matching(lambda c: flop_counts(c).forward >= 1e7)),
        ("d_model > 511.5", [2, 3, 4]),  # a float against an integer column is not cast to INTEGER
        ("d_model >= 0.5k and d_model <= 0.8k", [2, 3]),
        ("d_model > -1 and n_layers != 4", [0, 3, 4]),
        ("step_time_device = h100-sxm", [0, 2]),
        ("step_time <= 1e-3 or step_time > 2.5e-3", [0, 2]),
        ("reason = 'out of memory'", [4]),
        ('reason = "dominated at rung 0.25"', [3]),
        ("bias = true", [1]),
        ("bias != TRUE", [0, 2, 3, 4, 6]),
        ("loss <= 1.8", [1, 2]),
        ("status = complete and loss < 1", []),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_filter_selects_its_trials(filled, where, expected):
    assert numbers(filled, where) == expected


def test_no_filter_gives_every_trial_by_number_with_every_column(filled):
    frame = trials_frame(filled, "s")
    assert list(frame.columns) == list(FRAME_COLUMNS)
    assert list(frame["number"]) == list(TRIALS)
    row = frame.iloc[1]
    cfg = TRIALS[1][0]
    assert {k: row[k] for k in cfg.to_dict()} == cfg.to_dict()
    assert row["params_total"] == param_counts(cfg).total and row["study"] == "s"
    assert (row["status"], row["loss"], row["tokens_trained"]) == ("complete", 1.8, 4096)
    assert str(frame["d_model"].dtype) == "Int64" and str(frame["bias"].dtype) == "boolean"
    assert frame["d_model"].isna().tolist() == [n == 5 for n in TRIALS]


@pytest.mark.parametrize(
    ("sort", "limit", "expected"),
    [
        ("-loss", None, [3, 0, 1, 2, 4, 5, 6]),  # missing values last, then by number
        ("loss", None, [2, 1, 0, 3, 4, 5, 6]),
        ("d_model", None, [0, 1, 6, 2, 3, 4, 5]),
        ("- d_model", 3, [4, 3, 2]),
        ("trial", 2, [0, 1]),
        ("-number", None, [6, 5, 4, 3, 2, 1, 0]),
        ("loss", 2, [2, 1]),
        (None, 0, []),
        (None, 10**20, list(TRIALS)),  # beyond a 64-bit integer: no limit
    ],
)
def test_sort_and_limit_run_in_sql(filled, sort, limit, expected):
    assert numbers(filled, sort=sort, limit=limit) == expected


def test_filter_sort_and_limit_combine(filled):
    assert numbers(filled, "status = complete", sort="-d_model", limit=2) == [2, 1]


def test_an_empty_result_keeps_every_column(filled):
    frame = trials_frame(filled, "s", "d_model > 1G")
    assert frame.empty and list(frame.columns) == list(FRAME_COLUMNS)


def test_every_column_can_be_filtered_and_sorted_on_both_backends(filled):
    sample = {"number": "0", "string": "'x'", "bool": "true"}
    for name, kind in COLUMNS.items():
        op = ">=" if kind == "number" else "!="
        trials_frame(filled, "s", f"{name} {op} {sample[kind]} or {name} is null", sort=f"-{name}")
    for alias in ALIASES:
        trials_frame(filled, "s", f"{alias} is not null", sort=alias)


def test_other_studies_are_not_seen(storage):
    fill_study(storage, "other")
    assert numbers(storage) == list(TRIALS)
    assert len(trials_frame(storage, "other", "status = complete")) == 3


def test_an_unknown_study_lists_the_studies(storage):
    storage.create_study("t", **SPEC)
    with pytest.raises(UnknownNameError, match=r"unknown study 'nope' in .*; studies: s, t$"):
        trials_frame(storage, "nope")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sort": "dmodel"}, r"unknown sort column 'dmodel' \(did you mean 'd_model'\?\)"),
        ({"sort": "config_json"}, "unknown sort column 'config_json'"),
        ({"sort": "loss; drop table x"}, "unknown sort column"),
        ({"limit": -1}, "limit must be 0 or more"),
        ({"where": "d_model >"}, "expected a value after '>' at position 9, found the end"),
    ],
    ids=["typo", "json-column", "injection", "negative-limit", "bad-filter"],
)
def test_bad_sort_limit_or_filter(filled, kwargs, message):
    with pytest.raises(QueryError, match=message):
        trials_frame(filled, "s", **kwargs)


# --- the parser alone ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            "dmodel = 1",
            r"^unknown column 'dmodel' at position 0 \(did you mean 'd_model'\?\); valid: number, ",
        ),
        ("d_model >= ", r"^expected a value after '>=' at position 11, found the end$"),
        ("activation = 'swiglu", r"^unterminated string starting at position 13$"),
        ("d_model = 1 )", r"^unbalanced parenthesis: '\)' at position 12 closes nothing$"),
        ("(d_model = 1", r"^unbalanced parenthesis: '\(' at position 0 is never closed$"),
        ("activation < b", r"^operator '<' at position 11 does not apply to the string column 'activation'"),
        ("bias >= true", r"^operator '>=' .* boolean column 'bias'"),
        ("d_model = big", r"^'d_model' is a numeric column: expected a number at position 10, found 'big'$"),
        ("activation = 3", r"^'activation' is a string column: found the number 3 at position 13; quote it$"),
        ("bias = yes", r"^'bias' is a boolean column: expected true or false at position 7, found 'yes'$"),
        ("d_model = 2m", r"^malformed number '2m' at position 10: a number may end in k, M, G, T or P"),
        ("loss < 1e999", r"^number '1e999' at position 7 is out of range$"),
        ("reason = null", r"^compare with null using 'is null' or 'is not null' \(position 9\)$"),
        ("reason is 'x'", r"^expected 'null' after 'is' at position 10, found the string 'x'$"),
        ("d_model in 1", r"^expected '\(' after 'in' at position 11, found '1'$"),
        ("d_model in (1 2)", r"^expected ',' or '\)' in the 'in' list at position 14, found '2'$"),
        ("d_model 1", r"^expected an operator \(= == != < <= > >=, in, is\) after 'd_model' at position 8"),
        ("d_model = 1 d_model = 2", r"^expected 'and', 'or' or the end at position 12, found 'd_model'$"),
        ("", r"^empty filter"),
        (" \t\n", r"^empty filter"),
        ("and = 1", r"^expected a column name at position 0, found 'and'$"),
        ("d_model = 1;", r"^unexpected character ';' at position 11$"),
        ("d_model = 1\x00", r"^control character '\\x00' at position 11$"),
        ("x" * 2001, r"^filter is 2,001 characters long; the limit is 2,000$"),
        ("(" * (MAX_DEPTH + 1) + "d_model = 1" + ")" * (MAX_DEPTH + 1), rf"nested deeper than {MAX_DEPTH}"),
        ("not " * (MAX_DEPTH + 1) + "d_model = 1", rf"nested deeper than {MAX_DEPTH}"),
    ],
    ids=lambda v: v[:30].encode("unicode_escape").decode() if isinstance(v, str) else None,
)
def test_parse_errors_are_one_line_and_say_where(where, message):
    with pytest.raises(QueryError, match=message) as caught:
        compile_filter(where)
    assert "\n" not in str(caught.value)


def test_the_deepest_allowed_nesting_parses():
    compile_filter("(" * MAX_DEPTH + "d_model = 1" + ")" * MAX_DEPTH)
    compile_filter("not " * MAX_DEPTH + "d_model = 1")


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.psycopg.dialect()], ids=["sqlite", "pg"])
def test_values_are_bound_parameters_never_sql_text(dialect):
    where = """reason = "x' or 1=1 --" and activation in ('a); drop table t; --', b) and d_model > 2M"""
    compiled = compile_filter(where).compile(dialect=dialect)
    sql = str(compiled)
    assert "drop" not in sql.lower() and "1=1" not in sql and "2000000" not in sql
    assert sorted(map(str, compiled.params.values())) == sorted(
        ["x' or 1=1 --", "a); drop table t; --", "b", "2000000"]
    )


def test_si_suffixes_are_exact():
    params = compile_filter("params in (1.1M, 2k, 3G, 1T, 1e6, 0.5)").compile().params
    assert list(params.values()) == [1_100_000, 2_000, 3_000_000_000, 10**12, 1_000_000, 0.5]
    assert all(isinstance(v, int) for v in list(params.values())[:5])


def test_frame_columns_are_every_table_column_once():
    assert sorted(FRAME_COLUMNS) == sorted(c.name for c in Trial.__table__.columns)
    assert FRAME_COLUMNS[:3] == ("number", "status", "reason")
    assert set(COLUMNS) <= set(FRAME_COLUMNS) and not {"params_json", "config_json"} & set(COLUMNS)
