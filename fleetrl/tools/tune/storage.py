"""Where a study lives (a journal file, SQLite, PostgreSQL), opening it with Optuna's heartbeat, and the lock its tuners
take to count its trials and ask for one."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetrl.errors import FleetError
from fleetrl.files import exclusive_lock

HEARTBEAT_MAX_S = 60  # a running trial tells the storage it is alive at least this often


@dataclass
class StorageSpec:
    kind: str  # journal, sqlite or rdb
    url: str  # the RDB URL (sqlite and rdb), or the journal file's path
    path: Path | None = None  # the file of a journal or SQLite storage

    @property
    def shown(self) -> str:
        """The storage as printed and as optuna-dashboard takes it, with any password hidden."""
        if self.kind == "journal":
            return str(self.path)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def has_password(self) -> bool:
        """Whether the URL carries a password (which belongs in PGPASSWORD or ~/.pgpass, not in a command line)."""
        if self.kind != "rdb":
            return False
        from sqlalchemy.engine import make_url

        return make_url(self.url).password is not None

    @property
    def without_password(self) -> str:
        """The URL with its password left out, to give instead (libpq then reads PGPASSWORD or ~/.pgpass)."""
        from sqlalchemy.engine import make_url

        return make_url(self.url)._replace(password=None).render_as_string(hide_password=False)


STORAGE_FORMS = ("sqlite:///FILE.db (one machine), a journal file FILE.log or journal:///PATH (one machine or a shared filesystem), "
                 "or postgresql://USER@HOST[:PORT]/DATABASE (several machines; its password in PGPASSWORD or ~/.pgpass, not the URL)")


def parse_storage(spec: str) -> StorageSpec:
    spec = spec.strip()
    if spec.startswith("journal://"):
        path = spec[len("journal://"):]
        if not path:
            raise FleetError(f"--storage {spec!r} names no file; give journal:///ABSOLUTE/PATH or journal://RELATIVE/PATH.")
        return StorageSpec("journal", path, Path(path))
    if spec.startswith("sqlite:"):
        if not spec.startswith("sqlite:///") or spec[len("sqlite:///"):] in ("", ":memory:"):
            raise FleetError(f"--storage {spec!r} is not an SQLite file: give sqlite:///RELATIVE/FILE.db or sqlite:////ABSOLUTE/FILE.db "
                             f"(an in-memory study would be lost when the tuner ends).")
        return StorageSpec("sqlite", spec, Path(spec[len("sqlite:///"):]))
    scheme = spec.split("://", 1)[0] if "://" in spec else None
    if scheme is not None:
        if scheme.split("+")[0] not in ("postgresql", "postgres", "mysql", "oracle", "mssql"):
            raise FleetError(f"--storage {spec!r}: unknown storage {scheme!r}. Give {STORAGE_FORMS}.")
        if scheme == "postgres":  # SQLAlchemy knows only the long name
            spec = "postgresql" + spec[len("postgres"):]
        return StorageSpec("rdb", _with_driver(spec))
    path = Path(spec)
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return StorageSpec("sqlite", f"sqlite:///{spec}", path)
    if path.suffix in (".log", ".journal", ".jsonl"):
        return StorageSpec("journal", spec, path)
    raise FleetError(f"--storage {spec!r} is neither a URL nor a file ending in .log (journal) or .db (SQLite). Give {STORAGE_FORMS}.")


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; the tune extra installs psycopg (3), so use it when psycopg2 is absent."""
    if not url.startswith("postgresql://"):
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return url
    if importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg" + url[len("postgresql"):]
    raise FleetError("A PostgreSQL storage needs a driver, and neither psycopg nor psycopg2 is installed. "
                     "Install it with: pip install 'fleetrl[tune]'  (or: pip install 'psycopg[binary]')")


def open_storage(spec: StorageSpec, stale_after: float):
    """The Optuna storage. RDB storages (SQLite, PostgreSQL) carry Optuna's heartbeat, so a trial whose tuner was killed
    is failed (and queued again) once ``stale_after`` passes; journal trials get the same from :meth:`Tuner.sweep_stale`."""
    import optuna

    try:
        if spec.kind == "journal":
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            spec.path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(spec.path)))
        if spec.kind == "sqlite":
            spec.path.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}} if spec.kind == "sqlite" else {"pool_pre_ping": True}
        for attempt in range(5):  # tuners that create the tables at the same moment can collide; the loser retries
            try:
                # SQLite: tuners on this machine create the tables one at a time (the study's file lock); two at once
                # raced in Optuna's schema setup (UNIQUE constraint failed: alembic_version.version_num)
                lock = exclusive_lock(f"{spec.path}.fleetrl-lock") if spec.kind == "sqlite" else contextlib.nullcontext()
                with lock, warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat is "experimental"
                    return optuna.storages.RDBStorage(spec.url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval(stale_after),
                                                      grace_period=int(stale_after), heartbeat_stale_trial_callback=requeue_stale)
            except Exception as exc:  # noqa: BLE001 - sqlalchemy's OperationalError/IntegrityError, or a refused connection
                if attempt == 4 or not any(race in str(exc) for race in ("already exists", "duplicate key", "locked", "UNIQUE constraint")):
                    raise
                time.sleep(0.5 + attempt)
    except FleetError:
        raise
    except Exception as exc:  # noqa: BLE001 - every driver has its own errors; the user needs the first line and a hint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = {"rdb": "Check that the database server is running and reachable from here, and the user, password and database in the URL.",
                "sqlite": "Check that the folder exists and can be written (and is not on a network filesystem: use a journal file there).",
                "journal": "Check that the folder can be written."}[spec.kind]
        raise FleetError(f"Cannot open the study storage {spec.shown}: {type(exc).__name__}: {first} {hint}") from None


def heartbeat_interval(stale_after: float) -> int:
    return int(max(1, min(HEARTBEAT_MAX_S, stale_after / 4)))


def requeue_stale(study, trial) -> None:
    """A trial whose tuner died was failed; run its parameters again (the retry is counted instead of it)."""
    study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "retry_reason": "stale"})


class StudyLock:
    """Serialises 'count the trials, then ask for one' over every tuner of the study, so --trials is exact: a file lock
    beside a journal or SQLite file, an advisory lock on PostgreSQL. Other databases get only this process's lock."""

    def __init__(self, spec: StorageSpec, storage: Any, study_name: str):
        self._thread_lock = threading.Lock()
        self._spec, self._storage = spec, storage
        self._key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)
        self._lock_path = Path(f"{spec.path}.fleetrl-lock") if spec.path is not None else None

    @contextlib.contextmanager
    def held(self):
        with self._thread_lock:
            if self._lock_path is not None:
                with exclusive_lock(self._lock_path):
                    yield
            elif self._spec.url.startswith("postgresql"):
                from sqlalchemy import text

                with self._storage.engine.connect() as conn:
                    conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
                    conn.commit()
                    try:
                        yield
                    finally:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                        conn.commit()
            else:
                yield
