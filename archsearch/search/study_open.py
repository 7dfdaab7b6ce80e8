"""Opening a search's study: a clash, another space or a bad --replay refused before Ray starts,
then archsearch's record and Optuna's study created (or loaded) together.

A new study whose opening fails part-way, or whose run stops before its first trial, is removed
again (`discard_new_study`), so a plain rerun is not refused as a clash with an empty study.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict
from typing import TYPE_CHECKING

from archsearch.search.pool import SearchError
from archsearch.search.samplers import SAMPLERS
from archsearch.storage import StudyExistsError
from archsearch.trial import COMPLETE

if TYPE_CHECKING:
    import optuna

    from archsearch.search.options import SearchOptions
    from archsearch.search.spec import SearchSpec
    from archsearch.storage import Storage


def check_study(storage: Storage, spec: SearchSpec, options: SearchOptions) -> bool:
    """Refuse a study clash before Ray starts, from a read (`open_study` checks again, atomically).

    Ray starts before the study is created, so a Ctrl-C or a failure while it starts leaves
    no empty study behind for a plain rerun to refuse. Optuna's tables are opened here too, so
    tables this Optuna cannot use (a newer Optuna's) are refused before Ray starts.

    Returns:
        Whether no study of this name exists yet (the run will create it).
    """
    name = options.study
    storage.optuna_storage()
    if options.replay is not None:
        _check_replay(storage, spec, options, options.replay)
    record = storage.study(name)
    found = storage.optuna_objectives(name)
    if record is None:
        if found is not None:  # never adopted: its trials are not archsearch's
            raise SearchError(
                f"{storage.display_url} holds an Optuna study {name!r} that archsearch did not "
                "create: choose another --study"
            )
        return True
    if found is not None and found != len(record.objectives):
        raise SearchError(
            f"Optuna's study {name!r} has {found} objective(s), archsearch's {len(record.objectives)} "
            f"({', '.join(record.objectives)}): the database was changed outside archsearch"
        )
    if not options.resume:
        raise SearchError(
            f"study {options.study!r} already exists ({record.finished} finished trials): pass "
            "--resume to continue it, or choose another --study"
        )
    _check_fingerprint(spec, options.study, record.spec_fingerprint)
    return False


def _check_fingerprint(spec: SearchSpec, study: str, found: str) -> None:
    if found != spec.fingerprint:
        raise SearchError(
            f"study {study!r} was created from a different space file (fingerprint "
            f"{found[:12]}, this one {spec.fingerprint[:12]}): use another --study"
        )


def open_study(storage: Storage, spec: SearchSpec, options: SearchOptions, new: bool) -> optuna.Study:
    """Create or load the study (archsearch's record, then Optuna's). A `new` study whose
    creation fails part-way is removed again where the database still allows it, so a
    plain rerun is not refused as a clash with an empty study."""
    try:
        return _open_study(storage, spec, options)
    except BaseException:
        if new:
            discard_new_study(storage, options.study)
        raise


def discard_new_study(storage: Storage, name: str) -> None:
    """Remove the study `name` this driver created, if it still holds no trial: what fails before
    the first trial (a signal included) leaves no empty study for a plain rerun to clash with."""
    import optuna

    with contextlib.suppress(Exception):  # best effort: the database may be what failed
        if storage.discard_empty_study(name):
            ostorage = storage.optuna_storage()
            study_id = ostorage.get_study_id_from_name(name)
            if not ostorage.get_all_trials(study_id, deepcopy=False):
                optuna.delete_study(study_name=name, storage=ostorage)


def _open_study(storage: Storage, spec: SearchSpec, options: SearchOptions) -> optuna.Study:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = options.study
    try:  # atomic: of drivers starting one study together, one creates it, the others see it
        record = storage.create_study(
            name, spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
            objectives=spec.objectives, exist_ok=options.resume,
        )  # fmt: skip
    except StudyExistsError as exc:
        raise SearchError(f"{exc}: pass --resume to continue it, or choose another --study") from None
    _check_fingerprint(spec, name, record.spec_fingerprint)
    ostorage = storage.optuna_storage()
    # Trials recorded so far (any driver's); counted from archsearch's table because another
    # driver may not have created Optuna's study yet.
    existing = sum(storage.counts(name).values())
    seed = options.seed + existing  # drivers joining a study sample their own streams
    sampler = SAMPLERS[options.sampler](seed, len(spec.objectives))
    storage.add_search_run(name, {**asdict(options), "sampler_seed": seed})
    study = optuna.create_study(
        study_name=name,
        storage=ostorage,
        directions=["minimize"] * len(spec.objectives),
        sampler=sampler,
        load_if_exists=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(spec.objectives))  # shown by optuna-dashboard
    if options.replay is not None:
        _enqueue_replay(storage, study, options.replay)
    return study


def _enqueue_replay(storage: Storage, study: optuna.Study, source: str) -> None:
    """Queue the complete shapes of study `source` (same space), in trial order, ahead of the
    sampler's: the same shapes under another proxy (seed, precision, tokens), to compare them
    shape for shape. A shape this study already holds (a resumed replay) is not queued again."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # skip_if_exists
        for trial in storage.trials(source, status=COMPLETE):
            origin = {"replayed_from": f"{source}#{trial.number}"}
            study.enqueue_trial(trial.params, user_attrs=origin, skip_if_exists=True)


def _check_replay(storage: Storage, spec: SearchSpec, options: SearchOptions, source: str) -> None:
    """Refuse a --replay study that is missing, this one, or of another space: before Ray starts
    (`check_study`), not after it (seconds of start-up spent on a typo)."""
    record = storage.study(source, counts=False)
    if record is None:
        raise SearchError(f"--replay: no study {source!r} in this database")
    if source == options.study:
        raise SearchError("--replay names the study being searched; name another study")
    if record.spec.get("space") != spec.space.to_dict():
        raise SearchError(
            f"--replay: study {source!r} searched another space (its [model], [rules] or [budget] "
            "differ), so its shapes are not points of this one"
        )
