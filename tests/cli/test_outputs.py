"""Outputs that cannot be written (a read-only folder, a path below a file, a folder where a file
goes, the very database the command reads): each is refused in one line before anything is
computed, and nothing is left half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.helpers import one_line
from tests.readonly import read_only
from tests.storage.test_query import fill_study


@pytest.fixture
def study_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss", "flops"))
        for number, d_model in enumerate((64, 128)):
            cfg = config_from_knobs(d_model=d_model, n_layers=2, head_dim=32, vocab_size=256, seq_len=32)
            slot = db.claim_trial("s", 10, 60)
            db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
            db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": 3.0 - number}))
    return url


def _no_staging_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def test_export_into_a_read_only_folder_is_one_line(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        result = CliRunner().invoke(
            app, ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", str(folder / "out"),
                  "--storage", study_url],
        )  # fmt: skip
    one_line(result, (1, 2), str(folder))
    assert list(folder.iterdir()) == []


def test_export_below_a_regular_file_is_one_line(study_url, tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    args = ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--storage", study_url])
    one_line(result, (1, 2), str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "x"


def test_a_plot_into_a_read_only_folder_is_one_line(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        result = CliRunner().invoke(
            app, ["pareto", "--study", "s", "--storage", study_url, "--plot", str(folder / "f.png")]
        )
    one_line(result, (1, 2), str(folder))
    assert list(folder.iterdir()) == []


def test_a_plot_onto_an_existing_directory_is_one_line(study_url, tmp_path):
    (tmp_path / "f.png").mkdir()
    result = CliRunner().invoke(
        app, ["pareto", "--study", "s", "--storage", study_url, "--plot", str(tmp_path / "f.png")]
    )
    one_line(result, (1, 2), "f.png")
    assert list((tmp_path / "f.png").iterdir()) == []
    _no_staging_left(tmp_path)


ONTO_THE_DATABASE = {  # the database's name, the command, the output
    "trials-csv": ("trials.db", ["trials", "--study", "s", "--format", "csv", "-o", "{db}"]),
    "trials-by-symlink": ("trials.db", ["trials", "--study", "s", "--format", "json", "-o", "{link}"]),
    "trials-another-spelling": ("trials.db", ["trials", "--study", "s", "--format", "csv", "-o", "{other}"]),
    "report": ("trials.html", ["report", "--study", "s", "-o", "{db}"]),
    "pareto-plot": ("trials.html", ["pareto", "--study", "s", "--plot", "{db}"]),
    "ladder-plot": ("trials.png", ["ladder", "--study", "s", "--trial", "0", "--plot", "{db}"]),
}


@pytest.mark.parametrize(("name", "args"), ONTO_THE_DATABASE.values(), ids=ONTO_THE_DATABASE.keys())
def test_an_output_onto_the_database_read_is_refused_and_the_database_kept(tmp_path, name, args):
    """`trials --format csv -o trials.db --storage sqlite:///trials.db` replaced the database with
    the CSV (exit 0): every study in it lost."""
    import hashlib

    path = tmp_path / name
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    (tmp_path / "link.csv").symlink_to(path)
    (tmp_path / "sub").mkdir()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    spelled = {"db": path, "link": tmp_path / "link.csv", "other": tmp_path / "sub" / ".." / name}
    filled = [a.format(**spelled) for a in args]
    result = CliRunner().invoke(app, [*filled, "--storage", f"sqlite:///{path}"])
    output = filled[filled.index("-o") + 1] if "-o" in filled else filled[filled.index("--plot") + 1]
    assert one_line(result, 2) == (
        f"error: cannot write {output}: it is the database sqlite:///{path}, which this command reads"
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["link.csv", name, "sub"])


def test_a_ladder_plot_that_cannot_be_written_is_refused_before_any_rung_trains(study_url, tmp_path):
    """It was refused after the rungs had trained (35 s here, hours at real sizes), as 'File exists'."""
    (tmp_path / "file").write_text("x")
    plot = tmp_path / "file" / "ladder.png"
    args = ["ladder", "--study", "s", "--trial", "0", "--plot", str(plot), "--storage", study_url]
    result = CliRunner().invoke(app, args)
    assert one_line(result, 2) == f"error: cannot write {plot}: {tmp_path / 'file'} is a file, not a folder"
    with Storage.open(study_url, read_only=True) as db:
        assert db.ladder_rungs("s") == []


def test_trials_output_into_a_read_only_folder_is_refused_before_the_query(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        args = ["trials", "--study", "s", "--format", "csv", "-o", str(folder / "t.csv")]
        result = CliRunner().invoke(app, [*args, "--storage", study_url])
    one_line(result, 2, f"the folder {folder} is not writable")
