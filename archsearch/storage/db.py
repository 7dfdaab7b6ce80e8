"""The trial database: one SQLAlchemy URL holding Optuna's study and archsearch's own tables.

`Storage` is assembled from one class per kind of record, each in its own module, over the core
that opens the database and owns the one session helper (`core`):

- `studies`: studies and the driver runs on them;
- `trials`: the trial life cycle (claim, assign, lease, finish) and the trials read back;
- `validations`: long runs and `validate` reports;
- `ladders`: size-ladder rungs, their claims and fits;
- `promotions`: contenders trained on at longer budgets, each row its own claim;
- `devices`: devices and the kernel times measured on them.

How this stack fails was measured, and each rule below answers one failure:
- Every wait on the database is bounded (`engine`): SQLite's busy timeout; on PostgreSQL the
  connect timeout, a lock timeout, TCP keepalives and a client-side bound on each statement.
- A storage opened to read (`Storage.open(read_only=True)`, every command that only reads) never
  changes the database: it creates and upgrades nothing, refuses writes, and leaves the file
  byte for byte as it was.
- Creating the tables is serialised between processes, so several searches can start on a new
  database at once (`core`).
- Each trial's results are written in one transaction (`finish_trial`); the driver is the only
  writer of trial state, and workers hold no connection.
- Records that leave storage are frozen dataclasses (`records`), never ORM objects; the ORM
  (`schema`) and the row decoding (`rows`) stay inside the package.
"""

from __future__ import annotations

from archsearch.storage.devices import DeviceStore
from archsearch.storage.ladders import LadderStore
from archsearch.storage.promotions import PromotionStore
from archsearch.storage.studies import StudyStore
from archsearch.storage.trials import TrialStore
from archsearch.storage.validations import ValidationStore


class Storage(StudyStore, TrialStore, ValidationStore, LadderStore, PromotionStore, DeviceStore):
    """archsearch's tables (and Optuna's) in one database.

    Use `Storage.open(url)`; close with `close()` or a `with` block.
    """
