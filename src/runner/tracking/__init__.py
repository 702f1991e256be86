"""MLflow: every call to it is in this package, which callers use through the names below.

A run is complete in its directory (result.json, tensors.h5: runner.record.result) before MLflow is touched;
MLflow is fed from the run directory alone, so a run that could not reach its tracking store when it ran is
uploaded later, unchanged, by `runner sync RUN_DIR`. Nothing is lost and nothing is doubled: a pending
tracking.json (note) is written before the job starts; each MLflow run carries the tag `runner.run_key`, and
its id is noted as soon as it exists, so a later sync replaces a partial upload instead of adding a copy
(upload). A new SQLite store is created by one process at a time, whole or not at all (store).

- store: opening a store, its client, retries while SQLite is locked, experiments
- note: tracking.json, where (and whether) a run reached MLflow
- upload: logging a run directory, now (track) or later (sync)
- sweeps: a sweep's parent run
- search: reading runs back for reports and comparisons
What identifies a run (its params and name) is runner.record.naming's, with or without MLflow.
"""

from runner.tracking.link import TRACKING_FILE, read_link, write_link, write_pending
from runner.tracking.search import download_tensors, existing_run, history_runs, runs_of, search_runs, set_tags
from runner.tracking.store import (
    MODEL_TRAINING,
    RUNS_VIEW,
    UI_PORT,
    check_reachable,
    check_store_path,
    client,
    ensure_experiment,
    experiment_of,
    open_store,
    retry_on_lock,
    store_lock,
    ui_base,
)
from runner.tracking.sweeps import GUIDE, close_parent_run, create_parent_run
from runner.tracking.upload import (
    NO_RESULT,
    NOTE_LIMIT,
    Synced,
    SyncState,
    fit_note,
    log_comparison,
    log_files,
    sync,
    sync_one,
    track,
)

__all__ = [
    "GUIDE",
    "NOTE_LIMIT",
    "NO_RESULT",
    "RUNS_VIEW",
    "MODEL_TRAINING",
    "UI_PORT",
    "TRACKING_FILE",
    "check_reachable",
    "check_store_path",
    "client",
    "close_parent_run",
    "create_parent_run",
    "download_tensors",
    "ensure_experiment",
    "experiment_of",
    "fit_note",
    "log_comparison",
    "log_files",
    "open_store",
    "read_link",
    "retry_on_lock",
    "runs_of",
    "search_runs",
    "set_tags",
    "existing_run",
    "history_runs",
    "store_lock",
    "ui_base",
    "sync",
    "sync_one",
    "Synced",
    "SyncState",
    "track",
    "write_link",
    "write_pending",
]
