"""transformers' own load of the embedded Gemma 3 GGUF (`gguf_file=`), once per module: the
parity tests of the model (tests/models) and of LoRA (tests/lora) compare against the same
reference.

transformers reads the file through gguf-py three times (config, tokenizer, weights) and
dequantizes in numpy: 45-65 s on 2 cores, most of it gguf-py's parsing of the 262k-token
vocabulary through numpy's memmap hooks (5 s a read with a plain view, loader/gguf.py `_Reader`)
and its Q8_0 embedding (8 s; 0.5 s in torch with the same products, `dequantize_f32`, pinned
equal by tests/loader/test_gguf.py). The fixture lends transformers those two for the load, and
one reader for its three reads of the (read-only) file; everything else, the names, the
permutations, the config, the tokenizer, stays transformers'.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headrace.loader.cache import default_model_path


@pytest.fixture(scope="module")
def hf_gemma() -> tuple[Any, Any]:
    """(model in fp32, eval mode; its tokenizer). Shared by a module's tests: a test that
    changes the model (peft injects layers) works on a copy. Not held for the session: two
    modules use it, and a process of the suite would keep 1.1 GB of fp32 weights to the end."""
    model, tokenizer = load_hf_gemma()
    return model.eval(), tokenizer


def load_hf_gemma() -> tuple[Any, Any]:
    """(model in fp32, its tokenizer), loaded as the module docstring says; also for bench
    scripts that need transformers' model (bench/lora_train.py)."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headrace.loader.gguf import _Reader, dequantize_f32

    path = default_model_path()
    folder, name = str(path.parent), path.name
    readers: dict[str, _Reader] = {}

    def reader(file: str, *args: Any) -> _Reader:
        if file not in readers:
            readers[file] = _Reader(file, *args)
        return readers[file]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "dequantize", dequantize_f32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model, tokenizer
