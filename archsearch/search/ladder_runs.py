"""`archsearch ladder`'s training: the planned rungs (`ladder_plan`) trained on Ray, stored, fitted.

Each rung trains on the study's corpus on a Ray task (`search.validate.long_run`, on the shared
`pool`). Every rung is stored as it finishes (`Storage.add_ladder_rung`); a rerun trains only the
rungs not yet stored, and Ctrl-C keeps what finished. Two ladders of one study train each rung
once: a rung is claimed in the database just before it starts.

Then every design of the study laddered with that recipe with 2 sizes or more is fitted jointly
on non-embedding parameters (Kaplan et al. 2020: embeddings bend the law at small sizes; at
byte-level vocabularies they are 10-30% of a rung), and the fit is stored with its residuals
(`Storage.add_ladder_fit`); reading and predicting from it is `results.ladder`'s.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from archsearch.errors import ArchsearchError
from archsearch.search.ladder_plan import LadderOptions, PlannedRung, plan_ladder, rung_name
from archsearch.trial import COMPLETE

if TYPE_CHECKING:
    from archsearch.storage import LadderRungRecord, Storage

log = logging.getLogger(__name__)

# A ladder claims each rung just before it starts (`Storage.claim_ladder_rung`), so two ladders of
# one study train each rung once; storing a rung drops its claim, the ladder renews the rest every
# CLAIM_RENEW_S while it runs and releases them when it ends, and a killed ladder's claims lapse
# CLAIM_LEASE_S after their last renewal.
CLAIM_LEASE_S = 600.0
CLAIM_RENEW_S = 60.0


class FittedLaw(Protocol):
    """What `run_ladder` stores of a fit: the law over the rungs, as `results.ladder_fit.LadderFit`."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LadderProgress:
    """A snapshot for progress displays: rungs stored of those planned."""

    done: int
    total: int
    failed: int
    last: str
    elapsed_s: float


@dataclass(frozen=True)
class LadderSummary:
    study: str
    tokens_per_param: float
    batch_size: int
    planned: tuple[PlannedRung, ...]
    rungs: tuple[LadderRungRecord, ...]  # every stored rung of the study with this recipe
    fit: FittedLaw | None  # None when interrupted or when the rungs cannot be fitted
    fit_error: str | None  # why there is no fit
    trained: int
    skipped: int
    failed: tuple[str, ...]
    signal: int | None = None
    busy: tuple[str, ...] = ()  # rungs another ladder was training: left to it


def run_ladder(
    storage: Storage,
    options: LadderOptions,
    *,
    fit_rungs: Callable[[Sequence[LadderRungRecord]], FittedLaw],
    on_update: Callable[[LadderProgress], None] | None = None,
    run_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    planned: Sequence[PlannedRung] | None = None,
) -> LadderSummary:
    """Train the rungs not yet stored, then fit the study's ladders at this ratio and store the fit.

    Args:
        storage: the trial database (the study must be in it).
        options: see `LadderOptions`.
        fit_rungs: the law fitted over the stored rungs of this recipe
            (`results.ladder.fit_study_ladders`), raising an `ArchsearchError` whose message says
            why where the rungs cannot be fitted. Passed in, since fitting and reading fits is the
            `results` package's and the training side imports nothing of it.
        on_update: called with a `LadderProgress` after each rung, for progress displays.
        run_fn: the Ray task body; `search.validate.long_run` (train one config) by default.
        planned: `plan_ladder(storage, options)` where the caller made it already (the CLI's note
            before training reads it): planning reads every design's trials and shapes once.

    Returns:
        A `LadderSummary`; `fit` is None and `signal` set when SIGINT / SIGTERM stopped it early
        (finished rungs are kept; a rerun continues), and `fit_error` says why when the rungs
        cannot be fitted.

    Raises:
        LadderError: see `plan_ladder`.
        ReadOnlyStorageError: the database cannot be written here.
    """
    from archsearch.search.pool import RayPool, Stop, handle_signals
    from archsearch.search.validate import long_run
    from archsearch.storage import shape_key

    record = storage.require_study(options.study)
    storage.require_writable()  # before training rungs whose results could not be stored
    planned = plan_ladder(storage, options) if planned is None else planned
    ratio = float(options.tokens_per_param)
    batch = planned[0].batch_size  # one recipe: every rung's settings come from one proxy
    records = storage.ladder_rungs(options.study, ratio, batch)
    stored = {r.key for r in records}
    # A shape trained for another trial of the same design (two trials differing only in size,
    # laddered to the same --top) is the same run: its result is stored for this trial too.
    known = {(r.shape_key, r.seed): r for r in records}
    todo, twins = [], {}  # twins: shape key -> rungs of other trials waiting on its run
    for p in planned:
        key = shape_key(p.config)
        if (p.trial, ratio, batch, key, options.seed) in stored:
            continue
        if (key, options.seed) in known:
            _store_twin(storage, options, p, known[(key, options.seed)])
        elif key in twins:
            twins[key].append(p)
        else:
            twins[key] = []
            todo.append(p)
    skipped = len(planned) - len(todo) - sum(len(t) for t in twins.values())
    data = record.spec.get("data")
    start = time.monotonic()
    failed: list[str] = []
    busy: list[str] = []
    trained = 0
    stop = Stop("the ladder")
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    renewed = time.monotonic()

    def progress(last: str) -> None:
        if on_update is not None:
            elapsed = time.monotonic() - start
            on_update(LadderProgress(skipped + trained, len(planned), len(failed), last, elapsed))

    def admit(index: int) -> bool:
        """Claim a rung just before it starts; leave it to the ladder that holds it, or count it
        stored where another ladder stored it meanwhile."""
        nonlocal skipped
        rung = todo[index]
        why = storage.claim_ladder_rung(
            options.study, trial_number=rung.trial, tokens_per_param=ratio, batch_size=batch,
            config=rung.config, seed=options.seed, owner=owner, lease_s=CLAIM_LEASE_S,
        )  # fmt: skip
        if why is None:
            return True
        if why == "claimed":
            busy.append(rung_name(rung))
            progress(f"{rung_name(rung)}: another ladder is training it")
        else:  # stored by another ladder since this one planned
            skipped += 1
            progress(f"{rung_name(rung)}: stored by another ladder")
        return False

    def renew() -> None:
        nonlocal renewed
        if time.monotonic() - renewed >= CLAIM_RENEW_S:
            storage.renew_ladder_claims(owner, CLAIM_LEASE_S)
            renewed = time.monotonic()

    def done(index: int, result: dict[str, Any] | None, reason: str | None) -> None:
        nonlocal trained, skipped
        rung = todo[index]
        name = rung_name(rung)
        why = _store(storage, options, rung, result, reason)
        if why is None:
            trained += 1
            last = f"{name}: {result['val_loss']:.4f}"  # type: ignore[index]
            for twin in twins.get(shape_key(rung.config), []):  # the same run, stored once more
                _store(storage, options, twin, result, reason)
                skipped += 1
        else:
            failed.append(last := f"{name}: {why}")  # the summary reports it (the CLI once)
        progress(last)

    if todo:
        log.info("ladder %s: %d rungs to train, %d stored", options.study, len(todo), skipped)
        # Largest first: the longest runs start while the small ones fill the other workers.
        todo.sort(key=lambda p: -p.params)
        kept = "the rungs stored so far are kept; rerun the same command to train the rest"
        with RayPool(options, run_fn or long_run, "the ladder", kept) as pool, handle_signals(stop):  # type: ignore[arg-type]
            pool.arm()
            if on_update is not None:
                on_update(LadderProgress(skipped, len(planned), 0, f"training {len(todo)} rungs", 0.0))
            cpus = options.cpus_per_trial
            requests = [
                (rung_name(r), dict(config=r.config.to_dict(), settings=r.settings, data=data, cpus=cpus))
                for r in todo
            ]
            try:
                pool.run_each(
                    requests, retries=options.retries, stop=stop, done=done, admit=admit, tick=renew
                )
            finally:
                _release(storage, owner)
    rungs = tuple(storage.ladder_rungs(options.study, ratio, batch))
    if stop.signum is not None:
        return LadderSummary(
            options.study,
            ratio,
            batch,
            tuple(planned),
            rungs,
            None,
            None,
            trained,
            skipped,
            tuple(failed),
            stop.signum,
            tuple(busy),
        )
    fit, fit_error = None, None
    try:
        fit = fit_rungs(rungs)
    except ArchsearchError as exc:  # the rungs cannot be fitted (too few, one size): said, not raised
        fit_error = str(exc)
    if fit is not None:
        storage.add_ladder_fit(options.study, tokens_per_param=ratio, batch_size=batch, fit=fit.to_dict())
    return LadderSummary(
        options.study, ratio, batch, tuple(planned), rungs, fit, fit_error, trained, skipped, tuple(failed),
        busy=tuple(busy),
    )  # fmt: skip


def _release(storage: Storage, owner: str) -> None:
    """Drop this ladder's claims; where the database fails now, they lapse after their lease."""
    try:
        storage.release_ladder_claims(owner)
    except ArchsearchError as exc:
        log.warning(
            "the ladder's rung claims were not released (they lapse in %.0f s): %s", CLAIM_LEASE_S, exc
        )


def _store_twin(storage: Storage, options: LadderOptions, rung: PlannedRung, twin: LadderRungRecord) -> None:
    """Store `twin`'s run (the same shape, another trial) as `rung`'s, without training it again."""
    storage.add_ladder_rung(
        options.study,
        trial_number=rung.trial,
        tokens_per_param=options.tokens_per_param,
        batch_size=rung.batch_size,
        target_params=rung.target,
        config=rung.config,
        seed=options.seed,
        tokens=twin.tokens,
        val_loss=twin.val_loss,
        val_curve=twin.val_curve,
        settings={**twin.settings, "reused_from_trial": twin.trial_number},
        device_fingerprint=twin.device_fingerprint,
        corpus_fingerprint=twin.corpus_fingerprint,
        wall_time_s=0.0,
    )


def _store(
    storage: Storage,
    options: LadderOptions,
    rung: PlannedRung,
    result: dict[str, Any] | None,
    reason: str | None,
) -> str | None:
    """Store one finished rung (one transaction); the reason instead when it has no loss.

    A failed rung is not stored, so a rerun tries it again.
    """
    if result is None or result["status"] != COMPLETE or result["val_loss"] is None:
        return reason or (result or {}).get("reason") or "no loss"
    storage.add_ladder_rung(
        options.study,
        trial_number=rung.trial,
        tokens_per_param=options.tokens_per_param,
        batch_size=rung.batch_size,
        target_params=rung.target,
        config=rung.config,
        seed=options.seed,
        tokens=result["tokens"],
        val_loss=result["val_loss"],
        val_curve=result["val_curve"],
        settings=rung.settings,
        device_fingerprint=result["device_fingerprint"],
        corpus_fingerprint=result["corpus_fingerprint"],
        wall_time_s=result["wall_time_s"],
    )
    return None
