"""The trial database: Optuna's study and archsearch's own tables in one SQLAlchemy URL.

- `db`: `Storage`, one class per kind of record (`studies`, `trials`, `validations`, `ladders`,
  `devices`) over `core`, which opens the database and holds the one session helper;
- `schema`: the private ORM; `records`: the frozen records that leave storage; `rows`: rows
  written and read back, with their damage checks;
- `engine`: the URL and the engine per backend; `watchdog`: a bound on every PostgreSQL
  statement; `migrations`: creating and upgrading the tables;
- `errors`: storage's errors and how a driver's failure is classified;
- `query`: the trial filter language and trials as rows or a DataFrame;
- `measurement_cache`: the profiler's measurement cache backed by the database (`KernelCache`).

Imports neither torch nor Ray; Optuna is imported only when its storage is asked for.
"""

from archsearch.storage.db import Storage
from archsearch.storage.engine import DEFAULT_STORAGE_URL, STORAGE_ENV, database_files, storage_url
from archsearch.storage.errors import (
    DamagedStorageError,
    ReadOnlyStorageError,
    SchemaVersionError,
    StorageError,
    StorageUnavailableError,
    StudyExistsError,
    ValueRefusedError,
    database_failure,
    failure_cause,
)
from archsearch.storage.measurement_cache import KernelCache, measurement_row
from archsearch.storage.query import QueryError, TrialTable, compile_filter, trials_frame, trials_table
from archsearch.storage.records import (
    DeviceRecord,
    LadderFitRecord,
    LadderRungRecord,
    LongRunRecord,
    ProfileRecord,
    PromotionRanking,
    PromotionRecord,
    SearchRunRecord,
    SeedMean,
    StudyRecord,
    TrialRecord,
    ValidationRecord,
    shape_key,
)
from archsearch.storage.schema import SCHEMA_VERSION

__all__ = [
    "DEFAULT_STORAGE_URL",
    "SCHEMA_VERSION",
    "STORAGE_ENV",
    "DamagedStorageError",
    "DeviceRecord",
    "KernelCache",
    "LadderFitRecord",
    "LadderRungRecord",
    "LongRunRecord",
    "ProfileRecord",
    "PromotionRanking",
    "PromotionRecord",
    "QueryError",
    "ReadOnlyStorageError",
    "SchemaVersionError",
    "SearchRunRecord",
    "SeedMean",
    "Storage",
    "StorageError",
    "StorageUnavailableError",
    "StudyExistsError",
    "StudyRecord",
    "TrialRecord",
    "TrialTable",
    "ValidationRecord",
    "ValueRefusedError",
    "compile_filter",
    "database_failure",
    "database_files",
    "failure_cause",
    "measurement_row",
    "shape_key",
    "storage_url",
    "trials_frame",
    "trials_table",
]
