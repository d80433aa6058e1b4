"""`headrace bench` against a real `headrace serve` (a tiny random-weight Llama made here): the
output tokens the bench counts equal the server's own `headrace:generation_tokens_total` delta."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from headrace.bench.report import load_schema
from headrace.bench.scrape import parse_metrics
from headrace.bench.workloads import WORDS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("headrace.commands.serve") is None,
    reason="headrace serve is not written yet",
)
HEADRACE = Path(sys.executable).with_name("headrace")


def make_tiny_model(path: Path) -> Path:
    """A 2-layer Llama (hidden 64) with a byte-level BPE tokenizer trained on the bench's words."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([" ".join(WORDS)] * 5, trainer)
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    tok_config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("bench-serve")
    model = make_tiny_model(base / "tiny")
    port = free_port()
    cmd = [
        str(HEADRACE),
        "serve",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--num-threads",
        "1",
    ]
    log_path = base / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert proc.poll() is None, f"serve exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"serve not ready:\n{log_path.read_text()}"
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def generated_tokens(url: str) -> float:
    samples = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    return sum(samples.get("headrace:generation_tokens_total", []))


def test_bench_counts_the_tokens_the_server_generated(server_url: str, tmp_path: Path) -> None:
    before = generated_tokens(server_url)
    runs = []
    for api in ("completions", "generate"):
        out = tmp_path / api
        cmd = [
            sys.executable,
            "-m",
            "headrace.cli",
            "bench",
            "--url",
            server_url,
            "--api",
            api,
            "--concurrency",
            "1,4",
            "--num-requests",
            "8",
            "--workload",
            "uniform",
            "--prompt-len",
            "8:40",
            "--output-len",
            "4:16",
            "--scrape-interval",
            "0.1",
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((out / "bench.json").read_text())
        jsonschema.Draft202012Validator(load_schema()).validate(doc)
        assert doc["target"]["ignore_eos"] is True  # Headrace takes it: exact output lengths
        runs += doc["runs"]
        for name in ("load_sweep.png", "latency_cdf.png", "server_timeline.png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    after = generated_tokens(server_url)
    counted = 0
    for run in runs:
        s = run["summary"]
        assert s["completed"] == 8 and s["tokens_from_usage"] == 8
        assert s["output_tokens"] == sum(q["max_tokens"] for q in run["requests"])
        assert s["output_tokens"] == run["server"]["generation_tokens_delta"]
        assert run["server"]["timeline"]
        counted += s["output_tokens"]
    assert after - before == counted + 2 * 2  # + each bench's 2-token preflight request
