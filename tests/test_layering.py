"""The subpackages of `headrace` import one way: api → ledger → gateway → router → engine → loader →
models → layers → kernels → config, never back. Read from the source with `ast`, so a
new import that closes a cycle fails here, whatever the runtime import order hides."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import headrace

ROOT = Path(headrace.__file__).parent
# Each subpackage may import only those after it in this order (top-level modules — request,
# paths — sit under everything and may be imported by all; so do the settings, `config`).
ORDER = [
    "commands", "bench", "api", "batches", "ledger", "gateway", "router", "metrics", "engine",
    "lora", "loader", "models", "layers", "kernels", "config",
]  # fmt: skip


def imports() -> dict[str, set[str]]:
    """subpackage -> the other subpackages its modules import (lazily imported ones too)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if len(parts) < 2:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                bits = name.split(".")
                inside = bits[0] == "headrace" and len(bits) > 1 and (ROOT / bits[1]).is_dir()
                if inside and bits[1] != parts[0]:
                    edges[parts[0]].add(bits[1])
    return edges


def test_every_subpackage_is_placed_in_the_order() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(ORDER)


def test_imports_only_go_down_the_order() -> None:
    rank = {name: i for i, name in enumerate(ORDER)}
    upward = sorted(
        f"{src} imports {dst}"
        for src, dsts in imports().items()
        for dst in dsts
        if rank[dst] <= rank[src]
    )
    assert upward == []


def test_the_reader_sees_real_imports() -> None:
    edges = imports()
    assert "engine" in edges["api"]  # the reader finds real imports (not an empty graph)
    assert "api" not in edges["router"]


# Inside engine/: the front end reaches the core only; the core drives the scheduler and the
# runner; both use the KV side; nothing imports back up (shared vocabulary — messages,
# outputs, limits, logits_inputs — sits in engine/ itself, under all of them).
ENGINE_ALLOWED = {
    "frontend": {"core"},
    "core": {"sched", "runner", "kv"},
    "sched": {"kv"},
    "runner": {"kv"},
    "kv": set(),
}


def engine_imports() -> dict[str, set[str]]:
    """engine subpackage -> the other engine subpackages its modules import."""
    edges: dict[str, set[str]] = defaultdict(set)
    engine = ROOT / "engine"
    for path in engine.rglob("*.py"):
        parts = path.relative_to(engine).parts
        if len(parts) < 2:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                bits = node.module.split(".") + [""]
                inside = bits[:2] == ["headrace", "engine"] and (engine / bits[2]).is_dir()
                if inside and bits[2] and bits[2] != parts[0]:
                    edges[parts[0]].add(bits[2])
    return edges


def test_engine_subpackages_import_one_way() -> None:
    assert set(ENGINE_ALLOWED) == {
        p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").exists()
    }
    wrong = sorted(
        f"engine/{src} imports engine/{dst}"
        for src, dsts in engine_imports().items()
        for dst in dsts - ENGINE_ALLOWED[src]
    )
    assert wrong == []
    assert "core" in engine_imports()["frontend"]  # the reader sees real imports
