"""The trial contract (`archsearch.trial`): each state is defined once, and nothing writes one that
is not defined."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from archsearch.space import preset
from archsearch.storage import Storage
from archsearch.trial import COMPLETE, FINISHED, OUTCOMES, RUNNING, STATES, TrialOutcome

ROOT = Path(__file__).resolve().parents[1] / "archsearch"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (words there are prose, not states)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_module_spells_a_state_but_the_trial_module():
    """A state written as a literal elsewhere is a second definition: it would not follow a rename
    and a new state added there alone would reach the database unchecked."""
    spelled = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "trial.py":
            continue
        tree = ast.parse(path.read_text())
        prose = _docstrings(tree)
        spelled += [
            f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in STATES and id(node) not in prose
        ]
    assert not spelled


def test_every_state_is_explained_and_the_finished_ones_are_outcomes():
    assert all(isinstance(meaning, str) and meaning for meaning in STATES.values())
    assert set(FINISHED) <= set(STATES) and OUTCOMES == FINISHED and RUNNING not in FINISHED


def test_an_outcome_is_one_of_the_outcomes_and_round_trips():
    outcome = TrialOutcome(status=COMPLETE, train={"val_loss": 2.0}, profiles=({"device": "local"},))
    assert TrialOutcome.from_dict(outcome.to_dict()) == outcome
    for state in ("running", "timeout"):
        with pytest.raises(ValueError, match="unknown trial state"):
            TrialOutcome(status=state)


def test_storage_refuses_a_state_it_does_not_know(tmp_path):
    with Storage.open(f"sqlite:///{tmp_path / 't.db'}") as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss",))
        slot = db.claim_trial("s", 1, 60)
        with pytest.raises(ValueError, match="unknown trial state 'timeout'"):
            db.end_trial(slot, "timeout", "made up")
        assert db.counts("s") == {RUNNING: 1}  # nothing was written
        db.assign_trial(slot, number=0, optuna_trial_id=None, params={}, config=preset("byte-1m"))
        db.finish_trial(slot, TrialOutcome(status=COMPLETE, train={"val_loss": 1.0}))
        assert db.counts("s") == {COMPLETE: 1}
