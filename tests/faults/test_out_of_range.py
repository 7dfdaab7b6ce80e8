"""Numbers out of range on the command line and in a space file:
sizes past what the database stores (`--scale-to 1e400` and `--memory 1e400GB` were OverflowError
tracebacks; `[serve] memory = "1e400GB"` passed `space check`), a ladder of a million rungs (a
traceback), a million seeds (minutes spent building the plan, then more), and a NaN reference
point (a hypervolume of 0, exit 0). Each is refused in one line, exit 2, before anything is read
or written; the database is left byte for byte as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import ArchsearchError
from archsearch.storage import Storage
from tests.helpers import one_line
from tests.specs import tiny_toml
from tests.storage.test_query import fill_study


@pytest.fixture
def database(tmp_path) -> Path:
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    return path


EXPORT = ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", "{out}"]
REFUSED = {  # the arguments, and the one line's start
    "scale-to-1e400": (
        [*EXPORT, "--scale-to", "1e400"],
        "error: --scale-to '1e400' is too large: the database stores at most 2**63 - 1 (9.2e18)",
    ),
    "memory-1e400GB": (
        [*EXPORT, "--scale-to", "10M", "--memory", "1e400GB"],
        "error: --memory '1e400GB' is too large: the database stores at most 2**63 - 1 (9.2e18) (bytes)",
    ),
    "at-size-1e400": (
        ["pareto", "--study", "s", "--at-size", "1e400"],
        "error: --at-size '1e400' is too large: the database stores at most 2**63 - 1 (9.2e18)",
    ),
    "rungs-1000000": (
        ["ladder", "--study", "s", "--trial", "0", "--rungs", "1000000"],
        "error: --rungs must be at most 64 (rungs 2x apart from one parameter up to the most the database "
        "stores, 2**63 - 1), got 1000000",
    ),
    "seeds-1e9": (
        ["validate", "--study", "s", "--seeds", "1000000000"],
        "error: --seeds must be in 1..100, got 1000000000",
    ),
    "reference-nan": (
        ["pareto", "--study", "s", "--reference", "nan,nan"],
        "error: --reference takes finite numbers separated by commas, got 'nan,nan'",
    ),
    "reference-inf": (
        ["pareto", "--study", "s", "--reference", "3.0,inf"],
        "error: --reference takes finite numbers separated by commas, got '3.0,inf'",
    ),
    # One seed range for every seed a run takes; `train --seed -1` was numpy's traceback
    # after the model was built, `--seed 2**64` torch's, and validate and ladder took any seed.
    "train-seed-negative": (
        ["train", "--study", "s", "--trial", "0", "--tokens", "2048", "--seed", "-1"],
        "error: seed must be in 0..4294967295, got -1",
    ),
    "train-seed-2**64": (
        ["train", "--study", "s", "--trial", "0", "--tokens", "2048", "--seed", str(2**64)],
        "error: seed must be in 0..4294967295, got a 20-digit number",
    ),
    "ladder-seed-negative": (
        ["ladder", "--study", "s", "--trial", "0", "--seed", "-1"],
        "error: --seed must be in 0..4294967295, got -1",
    ),
    "validate-seed-negative": (
        ["validate", "--study", "s", "--trials", "4", "--seed", "-1"],
        "error: --seed must be in 0..4294967295, got -1",
    ),
    # Validate and ladder checked Ray's resources with `< 0`, which NaN passes: Ray
    # started (and the ladder opened) before Ray refused it; now search's rule, in one place.
    "validate-gpus-nan": (
        ["validate", "--study", "s", "--trials", "4", "--gpus-per-run", "nan"],
        "error: --gpus-per-run must be 0 or a finite number >= 0.0001, got nan",
    ),
    "ladder-gpus-nan": (
        ["ladder", "--study", "s", "--trial", "0", "--gpus-per-run", "nan"],
        "error: --gpus-per-run must be 0 or a finite number >= 0.0001, got nan",
    ),
    "ladder-cpus-inf": (
        ["ladder", "--study", "s", "--trial", "0", "--cpus-per-run", "inf"],
        "error: --cpus-per-run must be a finite number >= 0.0001, got inf",
    ),
    # `search --workers 99999999999` started a local Ray of as many logical CPUs, whose
    # start-up timed out a minute later blaming an overloaded GCS.
    "search-workers-huge": (
        ["search", "--space", "{space}", "--study", "s2", "--workers", "99999999999"],
        "error: --workers 99999999999 x --cpus-per-trial 1 is more than the 256 CPUs a local Ray starts "
        "with; join a cluster (--address) for more",
    ),
    "validate-workers-huge": (
        ["validate", "--study", "s", "--trials", "4", "--workers", "300"],
        "error: --workers 300 x --cpus-per-run 1 is more than the 256 CPUs a local Ray starts with; join a "
        "cluster (--address) for more",
    ),
    "ladder-workers-zero": (
        ["ladder", "--study", "s", "--trial", "0", "--workers", "0"],
        "error: --workers must be at least 1, got 0",
    ),
}


@pytest.mark.parametrize(("args", "line"), REFUSED.values(), ids=REFUSED.keys())
def test_a_number_out_of_range_is_one_line_and_changes_nothing(database, tmp_path, args, line):
    before = hashlib.sha256(database.read_bytes()).hexdigest()
    out = tmp_path / "out"
    space = Path(__file__).parents[2] / "examples" / "tiny.toml"
    filled = [a.format(out=out, space=space) for a in args]
    result = CliRunner().invoke(app, [*filled, "--storage", f"sqlite:///{database}"])
    assert one_line(result, 2) == line
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.db"]  # no output, no -wal left


def test_a_rung_below_one_parameter_is_the_ladder_s_own_error():
    """63 rungs under a small top: targets that rounded to 0 were refused as 'target_params must be
    positive', an internal check's words; the smallest rung is now one parameter, which no shape has."""
    from archsearch.search.ladder_plan import LadderError, rung_shape, rung_targets
    from archsearch.space.knobs import config_from_knobs

    targets = rung_targets(2_000_000, 63)
    assert targets[0] == 1 and targets[-1] == 2_000_000
    cfg = config_from_knobs(d_model=64, n_layers=2, head_dim=32, vocab_size=256, seq_len=32)
    with pytest.raises(
        LadderError, match=r"has 1 parameters within 25%: choose another --top or fewer --rungs$"
    ):
        rung_shape(cfg, targets[0])


@pytest.mark.parametrize(
    ("memory", "why"),
    [
        (
            '"1e400GB"',
            "memory '1e400GB' is too large: the database stores at most 2**63 - 1 (9.2e18) (bytes)",
        ),
        # Any integer of the file past 2**63 - 1 is refused as it is read.
        ("99999999999999999999", "a 20-digit number is past 2**63 - 1, the most the database stores"),
    ],
    ids=["string", "integer"],
)
def test_a_serve_memory_past_the_bound_is_refused_by_space_check(tmp_path, memory, why):
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(serve=f"batch = 1\nprompt_len = 16\ngen_len = 16\nmemory = {memory}"))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: [serve].memory: {why}"


def test_a_proxy_seed_out_of_range_is_refused_by_space_check(tmp_path):
    """`[proxy] seed = -1` passed `space check` (exit 0), and then failed every trial."""
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(proxy="tokens = 2048\nbatch_size = 4\nevals = 4\ndevice = 'cpu'\nseed = -1"))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: [proxy]: seed must be in 0..4294967295, got -1"


# --- bounds from the environment -----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "1e400", "abc", "nan", "0", "-1"])
def test_a_statement_bound_that_is_not_a_number_of_seconds_is_refused_when_the_database_opens(
    monkeypatch, value
):
    """`$ARCHSEARCH_DB_STATEMENT_S=inf` (or 1e400) lifted the bound on every PostgreSQL statement, and
    a typo was the default, both silently; `$ARCHSEARCH_RAY_START_S` was refused in one line."""
    from archsearch.storage import StorageError
    from tests.postgres import postgres_database

    with postgres_database() as url:
        monkeypatch.setenv("ARCHSEARCH_DB_STATEMENT_S", value)
        with pytest.raises(ArchsearchError) as info:
            Storage.open(url).close()
        assert not isinstance(info.value, StorageError)  # the setting's fault, not the database's
        assert str(info.value) == (
            f"$ARCHSEARCH_DB_STATEMENT_S must be a number of seconds in (0, 86400), got '{value}'"
        )
        monkeypatch.setenv("ARCHSEARCH_DB_STATEMENT_S", "5")
        Storage.open(url).close()


@pytest.mark.parametrize("name", ["ARCHSEARCH_DB_STATEMENT_S", "ARCHSEARCH_RAY_START_S"])
def test_both_bounds_from_the_environment_read_alike(monkeypatch, name):
    from archsearch.search.raystart import start_bound
    from archsearch.storage.watchdog import statement_bound_s

    read = statement_bound_s if name == "ARCHSEARCH_DB_STATEMENT_S" else start_bound
    monkeypatch.setenv(name, " 7.5 ")
    assert read() == 7.5
    monkeypatch.setenv(name, "")
    assert read() == 120.0
    monkeypatch.setenv(name, "inf")
    with pytest.raises(
        ArchsearchError, match=rf"^\${name} must be a number of seconds in \(0, 86400\), got 'inf'$"
    ):
        read()


@pytest.mark.parametrize(
    "args", [["width", str(2**53)], ["cost", "{config}"]], ids=["width-2**53", "cost-relu-2**40"]
)
def test_the_relu_risk_of_a_huge_width_takes_a_bounded_number_of_terms(tmp_path, monkeypatch, args):
    """The ReLU feature-loss risk summed one lgamma per unit of d_model into a list: `width 1e23`
    and `cost` of a ReLU shape 2**40 wide ran out of memory after minutes. The
    sum now stops where its terms stop counting: a few hundred terms at any size (`width` takes
    up to 2**53, as a shape's sizes; past it, one line)."""
    import math

    from archsearch.space import ArchConfig
    from archsearch.space.width import relu_feature_loss

    config = tmp_path / "wide.json"
    wide = {
        "vocab_size": 256,
        "seq_len": 256,
        "n_layers": 2,
        "d_model": 2**40,
        "n_heads": 2**34,
        "n_kv_heads": 2**34,
        "head_dim": 64,
        "d_ff": 2**42,
    }
    config.write_text(ArchConfig(activation="relu", **wide).to_json())
    calls, lgamma = [], math.lgamma

    def counted(x: float) -> float:
        calls.append(x)
        assert len(calls) < 10_000, "the sum takes a term per unit of width"
        return lgamma(x)

    relu_feature_loss.cache_clear()
    monkeypatch.setattr(math, "lgamma", counted)
    result = CliRunner().invoke(app, [a.format(config=config) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    relu_feature_loss.cache_clear()


def test_a_negative_kernel_count_is_refused():
    """`profile --top -3` showed every kernel but the last three, exit 0."""
    args = ["profile", "--preset", "byte-1m", "--device", "h100-sxm", "--top", "-3"]
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, result.output) == (
        2,
        "error: Invalid value for '--top': Input should be greater than or equal to 0 (see --help)\n",
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--aspect-ratio", "nan"], "error: aspect_ratio must be positive and finite, got nan"),
        (["--aspect-ratio", "inf"], "error: aspect_ratio must be positive and finite, got inf"),
        (
            ["--n-layers", "2", "--d-ff-ratio", "inf"],
            "error: d_ff_ratio must be positive and finite, got inf",
        ),
        (
            ["--n-layers", "2", "--d-ff-ratio", "nan", "--activation", "relu"],
            "error: d_ff_ratio must be positive and finite, got nan",
        ),
    ],
    ids=["aspect-nan", "aspect-inf", "d-ff-ratio-inf-gated", "d-ff-ratio-nan-plain"],
)
def test_a_non_finite_ratio_is_one_line(tmp_path, args, line):
    """`config new --aspect-ratio nan` was a ValueError traceback and `--d-ff-ratio inf` an
    OverflowError one: both passed a `<= 0` check."""
    out = tmp_path / "c.json"
    result = CliRunner().invoke(app, ["config", "new", "--d-model", "64", *args, "-o", str(out)])
    assert one_line(result, 2) == line
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--preset", "byte-1m", "--tokens", "2048", "--device", "cpu", "--threads", "5000"],
        ["profile", "--preset", "byte-1m", "--device", "cpu", "--steps", "0", "--threads", "5000"],
    ],
    ids=["train", "profile"],
)
def test_a_thread_count_past_any_machine_is_refused_before_torch_makes_them(args):
    """`train --threads 5000` was a segmentation fault (exit 139, no line) under a memory limit
    while torch's OpenMP made the threads."""
    assert one_line(CliRunner().invoke(app, args), 2) == "error: threads must be at most 1024, got 5000"


def test_a_proxy_thread_count_past_any_machine_is_refused_by_space_check(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml().replace("[proxy]\n", "[proxy]\nthreads = 5000\n", 1))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: [proxy]: threads must be at most 1024, got 5000"


def test_a_proxy_batch_no_shape_could_hold_is_refused_before_any_trial(tmp_path):
    """`[proxy] batch_size = 1e9` passed `space check`, and a search would have failed
    every trial on the trainer's memory check; the logits alone are the floor the spec checks."""
    space = tmp_path / "big.toml"
    space.write_text(tiny_toml(proxy='tokens = 2048\nbatch_size = 1_000_000_000\ndevice = "cpu"'))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    line = one_line(result, 2)
    assert line.startswith("error: [proxy].batch_size: 1,000,000,000 sequences of ")
    assert "their logits alone need" in line and "more than this cpu's" in line
    result = CliRunner().invoke(
        app, ["search", "--space", str(space), "--storage", f"sqlite:///{tmp_path / 't.db'}", "--trials", "1"]
    )
    assert one_line(result, 2) == line
    assert not (tmp_path / "t.db").exists()  # refused before the database was opened


def test_a_batch_that_fits_passes_the_memory_floor():
    from archsearch.search.spec import load_spec

    load_spec(Path(__file__).parents[2] / "examples" / "tiny.toml").preflight()
