"""The test suite's factories, in one place: `from factories import ...` from any test.

- `factories.models`: tiny random-weight checkpoints of every family (`make_tiny`,
  `make_tiny_llama`) and transformers' greedy reference (`hf_greedy`).
- `factories.devices`: `DEVICES` (cpu, and cuda where a GPU is present) for real-model tests.
- `factories.gguf`: the same models written as GGUF files.
- `factories.tokenizers`: small trained tokenizers of each style, `chat_tokenizer()`.
- `factories.engine`: the fake runner, schedulers, requests and `FakeCore` for engine tests.
- `factories.servers`: real `headrace serve` processes on 127.0.0.1 and readers of their
  metrics, SSE streams and stats.
- `factories.processes`: one call made at the same moment by several threads or processes.

The stand-in `EngineClient`s for in-process tests are in `fake_engine.py`.
"""

from factories.devices import DEVICES, NO_CUDA
from factories.engine import (
    FAKE_EOS,
    FAKE_VOCAB,
    FakeCore,
    FakeLaunchingRunner,
    FakeRunner,
    fake_next_token,
    fake_reference,
    make_prompt,
    make_request,
    make_scheduler,
)
from factories.gguf import permute, write_tiny_gguf
from factories.models import (
    ARCHS,
    GGUF_GEMMA3,
    VOCAB,
    hf_config,
    hf_greedy,
    make_tiny,
    make_tiny_llama,
    prompts,
)
from factories.servers import (
    MAX_MODEL_LEN,
    Server,
    free_port,
    read_metrics,
    replicas,
    routed,
    running,
    serve_args,
    serving,
    sse_events,
    start_server,
    stream_text,
    tiny_server_args,
    wait_for,
    write_tenants,
)
from factories.tokenizers import (
    CHAT_TEMPLATE,
    TokenizerAdapter,
    chat_tokenizer,
    make_byte_level_tokenizer,
    make_chat_tokenizer,
    make_sentencepiece_tokenizer,
    make_word_tokenizer,
    word_prompt,
)

__all__ = [
    "ARCHS", "CHAT_TEMPLATE", "DEVICES", "FAKE_EOS", "FAKE_VOCAB", "GGUF_GEMMA3", "MAX_MODEL_LEN",
    "NO_CUDA", "VOCAB", "FakeCore", "FakeLaunchingRunner", "FakeRunner", "Server",
    "TokenizerAdapter", "chat_tokenizer", "fake_next_token", "fake_reference", "free_port",
    "hf_config", "hf_greedy", "make_byte_level_tokenizer", "make_chat_tokenizer", "make_prompt",
    "make_request", "make_scheduler", "make_sentencepiece_tokenizer", "make_tiny",
    "make_tiny_llama", "make_word_tokenizer", "permute", "prompts", "read_metrics", "replicas",
    "routed", "running", "serve_args", "serving", "sse_events", "start_server", "stream_text",
    "tiny_server_args", "wait_for", "word_prompt", "write_tenants", "write_tiny_gguf",
]  # fmt: skip
