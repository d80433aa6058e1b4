"""The ledger on its own: records written in batches by its thread, read back by totals and
export; a database that cannot be written never makes `append` raise or block, holds the
records to its bound and counts the rest as dropped; `close` writes everything; a reopened
file keeps appending; the schema's version is recorded and a newer one refused."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.config import HeadraceConfig, LedgerConfig
from headrace.ledger import schema, store
from headrace.ledger.database import describe
from headrace.ledger.query import QueryError, UsageQuery, parse_time
from headrace.ledger.records import (
    REDACTED,
    USAGE_COLUMNS,
    AuditEntry,
    UsageRecord,
    key_id,
    redact,
)
from headrace.ledger.schema import VERSION, LedgerVersionError
from headrace.ledger.setup import ledger_path, record_action
from headrace.ledger.spill import Spill
from headrace.ledger.writer import Ledger
from ledger.conftest import postgres

DAY = 86_400.0
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def record(tenant: str = "acme", t: float = T0, **kw: object) -> UsageRecord:
    fields: dict[str, object] = {"model": "tiny", "route": "/v1/completions", "http_status": 200}
    fields.update(prompt_tokens=10, cached_tokens=4, completion_tokens=5)
    fields.update(kw)
    return UsageRecord(tenant, time=t, **fields)  # type: ignore[arg-type]


def rows(target: str | Path) -> list[dict[str, object]]:
    db = store.connect(target, create=False)
    try:
        return list(store.usage_rows(db, UsageQuery()))
    finally:
        db.close()


def test_records_are_written_in_batches_and_summed(ledger_target: str) -> None:
    ledger = Ledger(ledger_target, flush_s=60)
    for i in range(3):
        ledger.append(record("acme", T0 + i * DAY, completion_tokens=i))
    ledger.append(record("bob", T0, model="other"))
    ledger.append(record("bob", T0, model="other", adapter="support", completion_tokens=7))
    assert ledger.written == 0  # not flushed yet: one batch per flush_s
    assert ledger.sync()
    assert ledger.written == 5 and ledger.pending == 0
    by_day = ledger.totals(UsageQuery(tenant="acme", group_by="day"))
    assert [(r["day"], r["completion_tokens"]) for r in by_day] == [
        ("2023-11-14", 0), ("2023-11-15", 1), ("2023-11-16", 2),
    ]  # fmt: skip
    everyone = ledger.totals(UsageQuery(group_by="model"))
    assert [(r["tenant"], r["model"], r["requests"]) for r in everyone] == [
        ("acme", "tiny", 3), ("bob", "other", 2),
    ]  # fmt: skip
    adapters = ledger.totals(UsageQuery(tenant="bob", group_by="adapter"))
    # the base model's row first, on SQLite and PostgreSQL alike
    assert [(r["adapter"], r["completion_tokens"]) for r in adapters] == [(None, 5), ("support", 7)]
    ranged = ledger.totals(UsageQuery(start=T0 + DAY, end=T0 + 2 * DAY))
    assert [(r["tenant"], r["requests"], r["total_tokens"]) for r in ranged] == [("acme", 1, 11)]
    ledger.close()


def test_close_writes_everything_and_a_reopened_ledger_keeps_appending(ledger_target: str) -> None:
    path = ledger_target  # a file's directory is made
    ledger = Ledger(path, flush_s=60)
    for i in range(500):
        ledger.append(record(request_id=f"r{i}"))
    ledger.close()  # no sync: close alone flushes
    ledger.append(record(request_id="late"))  # after close: dropped, counted, no exception
    assert ledger.dropped == 1
    again = Ledger(path, flush_s=60)
    again.append(record(request_id="after-restart", resumed=True))
    again.close()
    got = rows(path)
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(500)] + ["after-restart"]
    assert [r["id"] for r in got] == list(range(1, 502)) and got[-1]["resumed"] is True


def test_an_unwritable_ledger_holds_records_to_its_bound_then_drops(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the ledger's directory should be")
    ledger = Ledger(blocker / "ledger.db", flush_s=60, max_pending=5)
    t0 = time.monotonic()
    for _ in range(8):
        ledger.append(record())  # never raises, never waits on the database
    assert time.monotonic() - t0 < 0.5
    ledger.sync()
    assert ledger.write_errors >= 1 and ledger.written == 0
    assert ledger.pending + ledger.dropped == 8 and ledger.pending <= 5
    blocker.unlink()  # the disk is back: the held records go in at the next flush
    ledger.sync()
    assert ledger.written == 5 and ledger.pending == 0
    ledger.close()
    assert len(rows(blocker / "ledger.db")) == 5


def test_the_schema_version_is_recorded_and_a_newer_one_refused(ledger_target: str) -> None:
    db = store.connect(ledger_target)
    store.connect(ledger_target).close()  # migrating again adds nothing
    versions = db.execute("SELECT version FROM schema_version ORDER BY version")
    assert [r["version"] for r in versions] == list(range(1, VERSION + 1))
    db.execute("INSERT INTO schema_version VALUES (?, 0)", (VERSION + 1,))
    db.close()
    with pytest.raises(LedgerVersionError, match="knows up to"):
        store.connect(ledger_target)


def test_past_the_bound_records_spill_to_a_file_and_are_written_back(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the ledger's directory should be")
    spill = tmp_path / "spill.jsonl"
    ledger = Ledger(blocker / "ledger.db", flush_s=60, max_pending=5, spill=spill)
    ledger.append(AuditEntry("tenants.reload", "k1", {"path": "/t.yaml"}, 200, {"tenants": 2}))
    for batch in ([0, 1, 2], [3, 4, 5, 6, 7]):  # a flush at most 5 apart (the queue's bound)
        for i in batch:
            ledger.append(record(request_id=f"a{i}"))
        ledger.sync()
    assert ledger.write_errors == 2 and ledger.pending == 5
    assert ledger.spilled == 4 and ledger.dropped == 0  # the oldest four, on disk
    assert len(spill.read_text().splitlines()) == 4
    for i in range(3):
        ledger.append(record(request_id=f"b{i}", adapter="support", resumed=True))
    ledger.sync()
    assert ledger.spilled == 7 and ledger.pending == 5 and ledger.dropped == 0
    blocker.unlink()  # the disk is back: the spilled records first, then the held ones
    ledger.sync()
    assert ledger.written == 12 and ledger.pending == 0 and not spill.exists()
    ledger.close()
    got = rows(blocker / "ledger.db")
    assert [r["request_id"] for r in got] == [f"a{i}" for i in range(8)] + ["b0", "b1", "b2"]
    assert (got[-1]["adapter"], got[-1]["resumed"]) == ("support", True)  # every field back
    db = store.connect(blocker / "ledger.db", create=False)
    audit = store.audit_rows(db, None, None, 10)
    db.close()
    assert [(e["action"], e["result"]) for e in audit] == [("tenants.reload", {"tenants": 2})]


def test_a_stop_during_an_outage_spills_and_the_next_start_writes_it(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("not a directory")
    spill = tmp_path / "spill.jsonl"
    ledger = Ledger(blocker / "ledger.db", flush_s=60, spill=spill)
    for i in range(3):
        ledger.append(record(request_id=f"r{i}"))
    ledger.close()  # cannot write: spilled, not lost
    assert ledger.spilled == 3 and ledger.dropped == 0 and ledger.pending == 0
    spill.write_text(spill.read_text() + '{"kind": "usage", "tenant": "cut sh')  # a crash mid-line
    blocker.unlink()
    again = Ledger(blocker / "ledger.db", flush_s=60, spill=spill)
    assert again.sync()  # no new record: the spilled ones are written all the same
    again.close()
    assert [r["request_id"] for r in rows(blocker / "ledger.db")] == ["r0", "r1", "r2"]
    assert not spill.exists()


def test_the_spill_file_survives_a_cut_line_and_garbage(tmp_path: Path) -> None:
    spill = Spill(tmp_path / "spill.jsonl")
    assert spill.add([record(request_id="a")])
    with spill.path.open("ab") as f:
        f.write(b'{"kind": "usage", "tenant": "cut sh')  # a crash mid-line
    assert spill.add([record(request_id="b")])  # on a line of its own
    with spill.path.open("ab") as f:
        f.write(b"5\n\xff\xfe\n[]\n")  # nothing a record could be made of
    got: list[object] = []
    assert spill.drain(got.extend) == 2
    assert [getattr(r, "request_id", None) for r in got] == ["a", "b"]
    assert not spill.waiting() and not spill.path.exists()


def test_a_version_1_ledger_is_migrated_with_its_rows_kept(
    ledger_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # a ledger as the first release wrote it
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        m.setattr(schema, "VERSION", 1)
        old = store.connect(ledger_target)
        columns = [c for c in USAGE_COLUMNS if c != "adapter"]
        values = [getattr(record(request_id="old"), c) for c in columns]
        marks = ", ".join("?" * len(columns))
        with old.transaction():
            old.execute(
                f"INSERT INTO usage ({', '.join(columns)}) VALUES ({marks})",
                [int(v) if isinstance(v, bool) else v for v in values],
            )
        old.close()
    ledger = Ledger(ledger_target, flush_s=60)  # the current server opens it: version 2
    ledger.append(record(request_id="new", adapter="support"))
    ledger.close()
    got = [(r["request_id"], r["model"], r["adapter"]) for r in rows(ledger_target)]
    assert got == [("old", "tiny", None), ("new", "tiny", "support")]
    db = store.connect(ledger_target)
    versions = db.execute("SELECT version FROM schema_version ORDER BY version")
    db.close()
    assert [r["version"] for r in versions] == [1, 2] == list(range(1, VERSION + 1))


def test_audit_entries_round_trip_with_secrets_redacted(ledger_target: str) -> None:
    ledger = Ledger(ledger_target, flush_s=60)
    args = redact({"via": "x", "api_key": "sk-1", "nested": [{"Authorization": "Bearer k"}]})
    ledger.append(AuditEntry("tenants.reload", key_id("admin"), args, 200, {"tenants": 2}))
    (entry,) = ledger.audit(None, None, 10)
    assert entry["arguments"] == {"via": "x", "api_key": REDACTED, "nested": [
        {"Authorization": REDACTED}
    ]}  # fmt: skip
    assert entry["result"] == {"tenants": 2} and entry["key_id"] == key_id("admin")
    assert len(entry["key_id"]) == 12 and "admin" not in json.dumps(entry)
    ledger.close()


def test_bad_queries_name_their_parameter() -> None:
    assert parse_time("start", "2023-11-14T22:13:20Z") == T0
    assert parse_time("start", "2023-11-14T22:13:20") == T0  # UTC unless it says otherwise
    assert parse_time("end", str(T0)) == T0
    with pytest.raises(QueryError, match="start: 'yesterday' is neither") as e:
        parse_time("start", "yesterday")
    assert e.value.param == "start"
    with pytest.raises(QueryError, match="'nan' is not a finite time"):
        parse_time("end", "nan")
    with pytest.raises(QueryError, match="group_by must be one of day, hour, model, adapter"):
        UsageQuery(group_by="week")
    with pytest.raises(QueryError, match="end is before start"):
        UsageQuery(start=2.0, end=1.0)


def test_usage_export_writes_csv_and_jsonl(ledger_target: str, tmp_path: Path) -> None:
    path = ledger_target
    ledger = Ledger(path, flush_s=60)
    ledger.append(record("acme", T0))
    ledger.append(record("bob", T0 + DAY))
    ledger.close()
    cmd = [sys.executable, "-m", "headrace.cli", "usage", "export", "--ledger", str(path)]
    csv_out = subprocess.run([*cmd, "--format", "csv"], capture_output=True, text=True, check=True)
    header, *lines = csv_out.stdout.splitlines()
    assert header.startswith("id,tenant,model,route,http_status") and len(lines) == 2
    jsonl = subprocess.run(
        [*cmd, "--format", "jsonl", "--tenant", "bob"], capture_output=True, text=True, check=True
    )
    (only,) = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert (only["tenant"], only["prompt_tokens"], only["time"]) == ("bob", 10, T0 + DAY)
    bad = subprocess.run([*cmd, "--start", "soon"], capture_output=True, text=True)
    assert bad.returncode == 2 and "neither Unix seconds" in bad.stderr
    cmd[-1] = str(tmp_path / "none.db")
    missing = subprocess.run(cmd, capture_output=True, text=True)
    assert missing.returncode == 2 and "no ledger there" in missing.stderr


def test_a_command_records_its_admin_action(ledger_target: str, tmp_path: Path) -> None:
    arguments = {"ray_namespace": "prod", "token": "s3cret"}
    record_action(ledger_target, "replicas.ray_down", arguments, 200, {"removed": ["a", "b"]})
    record_action("off", "replicas.ray_down", arguments, 200, {})  # no ledger: nothing, no error
    blocked = tmp_path / "file"
    blocked.write_text("")
    record_action(str(blocked / "l.db"), "replicas.ray_down", arguments, 200, {})  # logged only
    ledger = Ledger(ledger_target, flush_s=60)
    (entry,) = ledger.audit(None, None, 10)
    ledger.close()
    assert (entry["action"], entry["key_id"], entry["result"]) == (
        "replicas.ray_down", None, {"removed": ["a", "b"]},
    )  # fmt: skip
    assert entry["arguments"] == {"ray_namespace": "prod", "token": REDACTED}


def test_a_lost_postgresql_connection_holds_the_records_until_it_is_back() -> None:
    with postgres() as server:
        url = server.url + "/postgres"
        ledger = Ledger(url, flush_s=60)
        ledger.append(record(request_id="before"))
        ledger.sync()
        server.stop()  # the database goes away (an immediate stop: connections cut)
        for i in range(3):
            ledger.append(record(request_id=f"while-down-{i}"))
        ledger.sync()
        assert ledger.write_errors >= 1 and ledger.pending == 3 and ledger.dropped == 0
        server.start()
        ledger.sync()  # reconnects and writes what it held
        assert (ledger.written, ledger.pending) == (4, 0)
        ledger.close()
        got = [r["request_id"] for r in rows(url)]
        assert got == ["before"] + [f"while-down-{i}" for i in range(3)]


def test_serve_flags_pick_the_ledger(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from headrace.commands import serve

    def config(*argv: str) -> LedgerConfig:
        parser = argparse.ArgumentParser()
        serve.add_arguments(parser)
        return HeadraceConfig.from_args(parser.parse_args(list(argv))).ledger

    monkeypatch.setenv("HEADRACE_STATE", str(tmp_path))
    default = config()
    assert default.enabled and ledger_path(default) == str(tmp_path / "ledger.db")
    assert not config("--no-ledger").enabled and not config("--ledger", "off").enabled
    assert ledger_path(config("--ledger", "postgresql://u:p@h/db")) == "postgresql://u:p@h/db"
    assert config("--ledger-flush-s", "0.5").ledger_flush_s == 0.5
    with pytest.raises(ValueError, match="must be positive"):
        LedgerConfig(ledger_flush_s=0)
    assert describe("postgresql://u:pw@db.example:5433/books?sslmode=require") == (
        "postgresql://db.example:5433/books"
    )  # log lines never carry the password
