"""`headrace generate` prints the greedy continuation the engine computes."""

from __future__ import annotations

from headrace.cli import main
from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM
from headrace.request import SamplingParams


def test_generate_prints_the_greedy_continuation(tiny_model_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "The quick brown fox"]
    assert main([*args, "--max-tokens", "12", "--ignore-eos", "--num-kv-blocks", "32"]) == 0
    out, err = capsys.readouterr()
    llm = LLM(ModelConfig(model=str(tiny_model_dir)), CacheConfig(num_kv_blocks=32))
    want = llm.generate("The quick brown fox", SamplingParams(12, temperature=0, ignore_eos=True))
    assert out == want[0].text + "\n"
    assert "12 tokens, finish_reason=length" in err


def test_generate_refuses_bad_settings(tiny_model_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "Hi", "--temperature", "-1"]
    assert main(args) == 2
    assert "temperature must be >= 0" in capsys.readouterr().err
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "Hi", "--max-tokens", "5000"]
    assert main([*args, "--num-kv-blocks", "32"]) == 2
    assert "maximum context length is 512 tokens" in capsys.readouterr().err
