"""The trial database: Optuna's study and archsearch's own tables in one SQLAlchemy URL.

Imports neither torch nor Ray; Optuna is imported only when its storage is asked for.
"""

from archsearch.storage.db import (
    DEFAULT_STORAGE_URL,
    STORAGE_ENV,
    DamagedStorageError,
    LadderRungRecord,
    LongRunRecord,
    ReadOnlyStorageError,
    SchemaVersionError,
    Storage,
    StorageError,
    StorageUnavailableError,
    StudyExistsError,
    StudyRecord,
    TrialRecord,
    ValidationRecord,
    ValueRefusedError,
    database_failure,
    database_files,
    failure_cause,
    shape_key,
    storage_url,
)
from archsearch.storage.kernels import KernelCache, measurement_row
from archsearch.storage.query import QueryError, TrialTable, compile_filter, trials_frame, trials_table
from archsearch.storage.schema import SCHEMA_VERSION

__all__ = [
    "DEFAULT_STORAGE_URL",
    "SCHEMA_VERSION",
    "STORAGE_ENV",
    "DamagedStorageError",
    "KernelCache",
    "LadderRungRecord",
    "LongRunRecord",
    "QueryError",
    "ReadOnlyStorageError",
    "SchemaVersionError",
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
