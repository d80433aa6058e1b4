"""Reading PEFT adapters: what cannot be served exactly is refused with the file and the
reason, and a refused load leaves the adapters already loaded as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from factories import make_tiny, prompts
from factories.lora import make_adapter
from safetensors.torch import load_file, save_file

from headrace.config import CacheConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import greedy
from headrace.loader.hf import load_model
from headrace.lora.adapter import read_adapter
from headrace.lora.names import LoraError


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("lora-read")
    make_tiny("llama", tmp / "llama")
    make_tiny("qwen3", tmp / "qwen3")  # head_dim 32: q_proj of another shape
    make_adapter(tmp / "llama", tmp / "good", seed=1, r=8, alpha=16)
    make_adapter(tmp / "llama", tmp / "rs", seed=2, r=4, alpha=8, rslora=True)
    make_adapter(tmp / "qwen3", tmp / "other", seed=3)
    return tmp


def _variant(made: Path, name: str, **config: object) -> Path:
    path = made / name
    shutil.copytree(made / "good", path, dirs_exist_ok=True)
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    return path


def test_scaling_rank_and_sites(made: Path) -> None:
    good = read_adapter("good", made / "good", max_rank=64)
    assert good.rank == 8 and good.scaling == 16 / 8
    assert len(good.weights) == 2 * 7  # two layers, seven projections
    a, b = good.weights[(0, "q_proj")]
    assert a.shape == (8, 64) and b.shape == (64, 8)
    assert read_adapter("rs", made / "rs", max_rank=64).scaling == 8 / 4**0.5


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"r": 128}, "rank 128 is above --max-lora-rank 64"),
        ({"use_dora": True}, "DoRA is not supported"),
        ({"bias": "all"}, "bias 'all' is not supported"),
        ({"peft_type": "IA3"}, "only LORA is served"),
        ({"r": "8"}, "r must be a positive integer"),
        ({"rank_pattern": {"q_proj": 4}}, "per-module ranks"),
        ({"lora_alpha": None}, "lora_alpha must be a finite number"),
    ],
)
def test_refused_configs(made: Path, config: dict[str, object], message: str) -> None:
    path = _variant(made, "variant", **config)
    with pytest.raises(LoraError, match=message):
        read_adapter("x", path, max_rank=64)


def test_refused_files(made: Path, tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="cannot read the adapter config"):
        read_adapter("x", tmp_path / "missing", 64)
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoraError, match="not valid JSON"):
        read_adapter("x", tmp_path, 64)
    broken = _variant(made, "broken")
    (broken / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(LoraError, match="cannot read the adapter weights"):
        read_adapter("x", broken, 64)
    half = _variant(made, "half")
    tensors = load_file(half / "adapter_model.safetensors")
    save_file({k: v for k, v in tensors.items() if "q_proj.lora_B" not in k},
              half / "adapter_model.safetensors")  # fmt: skip
    with pytest.raises(LoraError, match="must come in pairs"):
        read_adapter("x", half, 64)
    with pytest.raises(LoraError, match="adapter name"):
        read_adapter("bad name!", made / "good", 64)


def test_a_refused_load_changes_nothing(made: Path) -> None:
    model, _ = load_model(made / "llama", torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(
        model, made / "llama", CacheConfig(block_size=4, num_kv_blocks=128)
    )
    good = runner.loras.load("good", made / "good")
    ps = prompts(2)
    before = greedy(runner, ps, 6, lora_ids=[good, 0])
    with pytest.raises(LoraError, match="do not fit"):  # q_proj of Qwen3's shape
        runner.loras.load("other", made / "other")
    with pytest.raises(LoraError, match="already loaded"):
        runner.loras.load("good", made / "rs")
    assert list(runner.loras.ids) == ["good"]
    assert greedy(runner, ps, 6, lora_ids=[good, 0]) == before


def test_only_the_decoders_layers(made: Path) -> None:
    """A vision tower's layers (a multimodal checkpoint's) are refused, never mapped onto the
    text layers of the same index."""
    path = _variant(made, "vision")
    tensors = load_file(path / "adapter_model.safetensors")
    key = "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight"
    save_file({**tensors, key: torch.zeros(8, 64)}, path / "adapter_model.safetensors")
    with pytest.raises(LoraError, match="is not a LoRA weight of"):
        read_adapter("x", path, 64)
    renamed = {k.replace("model.model.layers", "model.model.language_model.layers"): v
               for k, v in tensors.items()}  # fmt: skip
    save_file(renamed, path / "adapter_model.safetensors")
    assert (
        read_adapter("x", path, 64).weights.keys()
        == read_adapter("g", made / "good", 64).weights.keys()
    )
