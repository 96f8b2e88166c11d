"""logging.mlflow.tracking_uri, judged before anything runs: the forms MLflow can log to (a
server, a local folder or file: URI, a SQLite file, another database SQLAlchemy has a driver
for), each local one as an absolute URI the run's jobs all reach; one line for any other."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import urlparse

KEY = "logging.mlflow.tracking_uri"
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores
REMOTE = ("databricks", "databricks-uc", "uc")  # MLflow's hosted stores, by name
FORMS = "http(s)://HOST:PORT, sqlite:///PATH.db, file:///PATH or a folder"


def _database(uri: str) -> str | None:
    scheme = urlparse(uri).scheme
    base = scheme.split("+")[0]
    return base if base in DATABASES else None


def is_file_store(uri: str) -> bool:
    """A folder (plain or file:), MLflow's file store."""
    return urlparse(uri).scheme in ("", "file") and uri not in REMOTE


def problem(uri: str) -> str | None:
    """Why MLflow cannot log to `uri`, as one line naming the key; None when it can."""
    url = urlparse(uri)
    scheme = url.scheme
    if uri.split(":")[0] in REMOTE:
        return None
    if scheme in ("http", "https"):
        return None if url.hostname else f"{KEY}: {uri!r} names no server (http://HOST:PORT)"
    if is_file_store(uri):
        if url.netloc not in ("", "localhost"):
            return f"{KEY}: {uri!r} is a folder on host {url.netloc}; give file:///PATH"
        return None
    database = _database(uri)
    if database is None:
        return f"{KEY}: {uri!r} is no MLflow tracking store; give {FORMS}"
    # MLflow's SQL stores are SQLAlchemy's, migrated by Alembic; mlflow-skinny has neither
    missing = [m for m in ("sqlalchemy", "alembic") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"{KEY}: {database} stores need {' and '.join(missing)} beside MLflow "
            f"(pip install {' '.join(missing)}, or the project's tracking extra)"
        )
    from sqlalchemy.engine.url import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(uri)
    except ArgumentError:
        return f"{KEY}: {uri!r} is not a database URL (sqlite:///PATH.db, {database}://HOST/DB)"
    if database == "sqlite" and parsed.database in (None, "", ":memory:"):
        return f"{KEY}: {uri!r} keeps nothing once the job ends; give sqlite:///PATH.db"
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as e:
        return f"{KEY}: {database} needs its driver, {e.name} (pip install it)"
    return None


def absolute(uri: str, base: Path) -> str:
    """`uri` with a relative local path made absolute against `base` (where the run was
    launched), so that every job of the run logs to the same store."""
    url = urlparse(uri)
    if is_file_store(uri):
        return (base / Path(url.path if url.scheme else uri).expanduser()).resolve().as_uri()
    if _database(uri) == "sqlite":
        name = uri.split(":///", 1)[1] if ":///" in uri else ""
        if name and not name.startswith("/") and name != ":memory:":
            return f"{url.scheme}:///{(base / Path(name).expanduser()).resolve()}"
    return uri
