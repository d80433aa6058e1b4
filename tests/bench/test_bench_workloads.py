from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from headrace.bench.workloads import MIX_CLASSES, WORDS, Workload, load_tenants, parse_range


def test_requests_are_reproducible_and_seeded() -> None:
    w = Workload(kind="uniform", prompt_len=(4, 40), output_len=(1, 9), seed=3)
    assert [w.request(i) for i in range(20)] == [w.request(i) for i in range(20)]
    other = Workload(kind="uniform", prompt_len=(4, 40), output_len=(1, 9), seed=4)
    assert [w.request(i).prompt for i in range(5)] != [other.request(i).prompt for i in range(5)]


def test_prompts_are_plain_words_of_the_asked_length() -> None:
    w = Workload(kind="uniform", prompt_len=(16, 64), output_len=(8, 32))
    specs = [w.request(i) for i in range(200)]
    for s in specs:
        words = s.prompt.split()
        assert len(words) == s.prompt_words and 16 <= s.prompt_words <= 64
        assert set(words) <= set(WORDS)
        assert 8 <= s.max_tokens <= 32
    assert len({s.prompt for s in specs}) == len(specs)  # varied: no shared prompts
    fixed = Workload(prompt_len=(7, 7), output_len=(5, 5)).request(0)
    assert (fixed.prompt_words, fixed.max_tokens) == (7, 5)


def test_mix_follows_its_documented_class_weights() -> None:
    w = Workload(kind="mix", seed=1)
    specs = [w.request(i) for i in range(3000)]
    counts = Counter(s.kind for s in specs)
    for cls in MIX_CLASSES:
        assert counts[cls.name] / len(specs) == pytest.approx(cls.weight, abs=0.04)
        mine = [s for s in specs if s.kind == cls.name]
        assert all(cls.prompt.lo <= s.prompt_words <= cls.prompt.hi for s in mine)
        assert all(cls.output.lo <= s.max_tokens <= cls.output.hi for s in mine)
    rag = sorted(s.prompt_words for s in specs if s.kind == "rag")
    chat = sorted(s.prompt_words for s in specs if s.kind == "chat")
    assert rag[len(rag) // 2] > 4 * chat[len(chat) // 2]  # long-prompt class is long


def test_max_len_caps_prompt_and_output() -> None:
    w = Workload(kind="mix", max_len=100)
    for i in range(300):
        s = w.request(i)
        assert s.prompt_words + s.max_tokens <= 100


def test_tenants_are_picked_by_share(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(
        "tenants:\n"
        "  - {name: acme, api_key: k-acme, tier: paid, share: 1}\n"
        "  - {name: flood, api_key: k-flood, tier: free, share: 3}\n"
    )
    tenants = load_tenants(str(path))
    assert [t.tier for t in tenants] == ["paid", "free"]
    w = Workload(tenants=tenants)
    counts = Counter(w.request(i).tenant.name for i in range(2000))  # type: ignore[union-attr]
    assert counts["flood"] / 2000 == pytest.approx(0.75, abs=0.04)


@pytest.mark.parametrize(
    "text",
    ["tenants: []\n", "tenants:\n  - {api_key: x}\n", "tenants:\n  - {name: a, share: -1}\n"],
)
def test_bad_tenants_files_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ValueError):
        load_tenants(str(path))


def test_ranges_and_invalid_workloads() -> None:
    assert parse_range("128") == (128, 128)
    assert parse_range("16:512") == (16, 512)
    assert parse_range("16-512") == (16, 512)
    for bad in ("x", "1:2:3", ""):
        with pytest.raises(ValueError):
            parse_range(bad)
    with pytest.raises(ValueError):
        Workload(prompt_len=(10, 5))
    with pytest.raises(ValueError):
        Workload(kind="zipf")
