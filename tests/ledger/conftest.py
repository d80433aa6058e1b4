"""A PostgreSQL server of its own for the ledger's tests (Debian's `postgresql`, started from
`initdb` in a temporary directory on 127.0.0.1, as the `postgres` user when run as root), and a
fresh database per test. Skipped, saying why, without the server or psycopg."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import pytest
from factories import free_port

_numbers = itertools.count()


def _initdb() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return found[-1] if found else shutil.which("initdb")


def _as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as `postgres`."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PostgresServer:
    """A PostgreSQL server in a temporary directory, stopped and started again at will."""

    def __init__(self) -> None:
        pytest.importorskip("psycopg", reason="psycopg is not installed (the postgres extra)")
        initdb = _initdb()
        if initdb is None:
            pytest.skip("PostgreSQL is not installed (make test installs Debian's when root)")
        self.pg_ctl = os.path.join(os.path.dirname(initdb), "pg_ctl")
        self.root = tempfile.mkdtemp(prefix="headrace-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.data, self.port = os.path.join(self.root, "data"), free_port()
        self.url = f"postgresql://headrace@127.0.0.1:{self.port}"
        _run([initdb, "-D", self.data, "-U", "headrace", "--auth=trust"])

    def start(self) -> None:
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -F"
        log = os.path.join(self.root, "log")
        _run([self.pg_ctl, "-D", self.data, "-o", options, "-l", log, "-w", "start"])

    def stop(self) -> None:
        _run([self.pg_ctl, "-D", self.data, "-m", "immediate", "-w", "stop"])

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _run(cmd: list[str]) -> None:
    subprocess.run(_as_owner(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, check=True)


@contextlib.contextmanager
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.remove()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The server's base URL (user `headrace`, trusted, on 127.0.0.1)."""
    with postgres() as server:
        yield server.url


@pytest.fixture
def postgres_url(postgres_server: str) -> Callable[[], str]:
    """Makes a fresh, empty database and gives its URL."""
    import psycopg

    def fresh() -> str:
        name = f"ledger_{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(postgres_server + "/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"{postgres_server}/{name}"

    return fresh


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_target(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """Where a test's ledger lives: an SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path) + "/state/ledger.db"
    fresh: Callable[[], str] = request.getfixturevalue("postgres_url")
    return fresh()
