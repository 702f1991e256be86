"""The MLflow tracking store and experiment a run names, checked before the job: a store MLflow can open, a name
its folder can take."""

from __future__ import annotations

import re

from runner.errors import ConfigError

EXPERIMENT_NAME_MAX = 256
UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f]|^\.\.?$")  # path separators, control characters, . and ..


# MLflow's own tracking stores (mlflow.tracking._tracking_service.utils); plugins add theirs as entry points.
STORE_SCHEMES = ("file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
# SQLAlchemy's driver modules: the default one of each database, and those named as `scheme+driver`.
DATABASE_DRIVERS = {
    "postgresql": "psycopg2",
    "mysql": "MySQLdb",
    "mssql": "pyodbc",
    "psycopg2": "psycopg2",
    "psycopg": "psycopg",
    "pg8000": "pg8000",
    "pymysql": "pymysql",
    "mysqldb": "MySQLdb",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}


def check_store_scheme(uri: str) -> None:
    """A store MLflow can open: a scheme it (or an installed plugin) knows, and the database's driver
    installed. Found here, before the job, not after it ran."""
    import importlib.util

    scheme, separator, _ = uri.partition("://")
    if not separator or "/" in scheme:  # a plain path: MLflow's file store
        return
    database, _, driver = scheme.partition("+")
    if database not in STORE_SCHEMES and database not in _plugin_schemes():
        raise ConfigError(
            f"tracking.uri={uri}: MLflow has no store for {scheme}:// "
            "(sqlite:///PATH.db, http://HOST:PORT, postgresql://..., mysql://..., or a plugin's scheme)"
        )
    module = DATABASE_DRIVERS.get(driver or database)
    if module and importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"tracking.uri={uri}: the {scheme} store needs the Python module {module}, which is not installed"
        )


def _plugin_schemes() -> set[str]:
    import importlib.metadata

    return {entry.name for entry in importlib.metadata.entry_points(group="mlflow.tracking_store")}


def check_tracking(uri: str | None, experiment: str | None) -> None:
    """tracking.uri and tracking.experiment as MLflow and the store's folder can take them."""
    if not uri or not str(uri).strip():
        raise ConfigError("tracking.uri is empty: give a store (sqlite:///PATH.db, http://HOST:PORT) or tracking=none")
    check_store_scheme(str(uri))
    if not experiment or not str(experiment).strip():
        raise ConfigError("tracking.experiment is empty: give the experiment a name")
    experiment = str(experiment)
    if len(experiment) > EXPERIMENT_NAME_MAX:
        raise ConfigError(
            f"tracking.experiment is {len(experiment)} characters long: at most {EXPERIMENT_NAME_MAX} are allowed"
        )
    if UNSAFE_NAME.search(experiment):
        raise ConfigError(
            f"tracking.experiment={experiment!r}: a name, not a path (no '/', '\\', '..' or control characters)"
        )
