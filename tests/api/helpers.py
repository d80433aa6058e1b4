"""API test helpers: a tiny random-weight Llama (transformers + a locally trained byte-level BPE
tokenizer) and real `headrace serve` processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Headrace serves language models over HTTP with continuous batching.",
    "Once upon a time there was a small model that wrote random words.",
    "Numbers 0123456789 and punctuation: commas, dots; colons!",
]
MAX_MODEL_LEN = 512


def make_tiny_llama(path: Path) -> Path:
    """config.json + model.safetensors + tokenizer.json (+ tokenizer_config.json, chat template)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    tok_config = {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
    }  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A `headrace serve` child process."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    health_seen: list[int] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).status_code
                self.health_seen.append(status)
                if status == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Server:
    """`env` adds to (or overrides) this process's environment for the server."""
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "headrace.cli", "serve", "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Server(proc, f"http://127.0.0.1:{port}", log_path)


def serving(
    args: list[str], log_dir: Path, env: dict[str, str] | None = None, *, clean: bool = True
) -> Iterator[Server]:
    """A ready server for a fixture to `yield from`, stopped afterwards; with `clean`, it must
    have exited cleanly (0, or the SIGTERM uvicorn re-raises after a clean stop)."""
    server = start_server(args, log_dir, env)
    try:
        server.wait_ready()
        yield server
    finally:
        code = server.stop()
    if clean:
        assert code in (0, -signal.SIGTERM), server.log()


def write_tenants(directory: Path, text: str) -> Path:
    path = directory / "tenants.yaml"
    path.write_text(text)
    return path


def tiny_server_args(model_dir: Path) -> list[str]:
    return [
        "--model", str(model_dir), "--served-model-name", "tiny", "--dtype", "float32",
        "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "256", "--block-size", "16",
        "--num-threads", "1", "--log-level", "warning", "--request-timeout-s", "60",
    ]  # fmt: skip


def read_metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Prometheus text as `{'name{labels}': value}`; `name` alone sums every label set."""
    r = httpx.get(url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    text = r.text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
        name = key.split("{", 1)[0]
        if name != key:
            out[name] = out.get(name, 0.0) + float(value)
    return out


def sse_events(lines: Iterable[str]) -> list[str]:
    """The `data:` payloads of an SSE stream, in order."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]
