"""Hugging Face directories: sharded weights load the same; broken ones fail with an error that
names the file or tensor and what was expected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from factories import make_tiny
from safetensors.torch import load_file, save_file

from headrace.loader.errors import ModelLoadError
from headrace.loader.hf import load_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3")
    make_tiny("qwen3", path)
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(path: Path) -> torch.nn.Module:
    return load_model(path, torch.float32, CPU, 64)[0]


def test_sharded_checkpoint_loads_like_one_file(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_dir).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    shutil.copy(tiny_dir / "tokenizer.json", sharded)
    a, b = _load(tiny_dir).state_dict(), _load(sharded).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_load_casts_weights(tiny_dir: Path) -> None:
    model = load_model(tiny_dir, torch.bfloat16, CPU, 64)[0]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_truncated_safetensors(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*truncated"):
        _load(path)


def test_wrong_shaped_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors[name] = torch.zeros(7, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"k_proj\.weight.*\(7, 64\), expected \(64, 64\)"):
        _load(path)


def test_missing_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensors: model\.layers\.0\.mlp\.up_proj"):
        _load(path)


def test_unexpected_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        _load(path)


def test_unsupported_architecture(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError, match="unsupported architecture 'GPTNeoXForCausalLM'.*Gemma3ForCausalLM"
    ):
        _load(path)


def test_missing_files(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        _load(path)
    (path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json: missing config\.json"):
        _load(path)


def test_missing_shard(tiny_dir: Path, tmp_path: Path) -> None:
    path = _copy(tiny_dir, tmp_path / "m")
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors: missing shard"):
        _load(path)
