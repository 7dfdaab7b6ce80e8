"""The trial database: Optuna's study and archsearch's own tables in one SQLAlchemy URL.

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
from archsearch.storage.kernels import KernelCache, measurement_row
from archsearch.storage.query import QueryError, TrialTable, compile_filter, trials_frame, trials_table
from archsearch.storage.records import (
    DeviceRecord,
    LadderFitRecord,
    LadderRungRecord,
    LongRunRecord,
    ProfileRecord,
    PromotionRecord,
    SearchRunRecord,
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
    "PromotionRecord",
    "QueryError",
    "ReadOnlyStorageError",
    "SchemaVersionError",
    "SearchRunRecord",
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
