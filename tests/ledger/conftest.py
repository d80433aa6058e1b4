"""A PostgreSQL server of its own for the ledger's tests (Debian's `postgresql`, started from
`initdb` in a temporary directory on 127.0.0.1, as the `postgres` user when run as root), and a
fresh database per test. Skipped, saying why, without the server or psycopg."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The server's base URL (user `headrace`, trusted, on 127.0.0.1)."""
    pytest.importorskip("psycopg", reason="psycopg is not installed (the postgres extra)")
    initdb = _initdb()
    if initdb is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's when root)")
    bindir = os.path.dirname(initdb)
    root = tempfile.mkdtemp(prefix="headrace-pg-")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, port = os.path.join(root, "data"), free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT, "check": True}
    subprocess.run(_as_owner([initdb, "-D", data, "-U", "headrace", "--auth=trust"]), **quiet)
    options = f"-p {port} -h 127.0.0.1 -k {root} -F"
    pg_ctl = os.path.join(bindir, "pg_ctl")
    log = os.path.join(root, "log")
    subprocess.run(
        _as_owner([pg_ctl, "-D", data, "-o", options, "-l", log, "-w", "start"]), **quiet
    )
    try:
        yield f"postgresql://headrace@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_owner([pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"]), **quiet)
        shutil.rmtree(root, ignore_errors=True)


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
