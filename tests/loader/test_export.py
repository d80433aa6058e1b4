"""`headrace export`: a tiny Gemma 3 GGUF exported as an HF directory that transformers loads
and continues exactly as Headrace does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import GGUF_GEMMA3, hf_greedy, make_tiny, prompts, write_tiny_gguf
from safetensors import safe_open

from headrace.cli import main
from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.loader.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export")
    model = make_tiny("gemma3", path / "hf", **GGUF_GEMMA3)
    write_tiny_gguf(model, "gemma3", path / "tiny-gemma3.gguf")
    return path / "tiny-gemma3.gguf"


def test_export_loads_in_transformers_and_generates_the_same(
    tiny_gguf: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HEADRACE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_gguf), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "<start_of_turn>" in tok_config["chat_template"]

    runner = ModelRunner(ModelConfig(model=str(tiny_gguf), dtype="float32"), CacheConfig())
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ps = prompts(4)
    assert greedy(runner, ps, 16) == [hf_greedy(hf_model, p, 16) for p in ps]
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert load_tokenizer(runner.model_dir).encode("<eos>t5") == hf_tok("<eos>t5")["input_ids"]


def test_export_bf16(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bf16"
    assert (
        main(["export", "--model", str(tiny_gguf), "--out", str(out), "--dtype", "bfloat16"]) == 0
    )
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_export_of_a_missing_model_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--model", str(tmp_path / "nope.gguf"), "--out", str(tmp_path)]) == 1
    assert "nope.gguf" in capsys.readouterr().err
