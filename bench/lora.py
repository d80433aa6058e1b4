"""LoRA decode cost and load time, engine runner alone. Prints JSON.

    .venv/bin/python bench/lora.py                      # Gemma 3 270M, 32 rows, rank 16
    .venv/bin/python bench/lora.py --rows 32 --rank 16 --steps 20
    .venv/bin/python bench/lora.py --model DIR --steps 2  # any HF directory (a smoke run)

A decode step of `--rows` sequences (after a 64-token prompt each) is timed three ways, in turn
within one process so that the ratios come from the same minutes of a noisy host: `plain` (no
adapter), `one` (one adapter for every row) and `each` (a different adapter per row), every
adapter of rank `--rank` on all seven projections (random weights written as a PEFT directory,
or copies of a trained one: `--trained DIR`, from bench/lora_train.py). The issue's targets:
`each` <= 1.3x `plain`, `one` <= 1.2x. `load_ms` is the median time to read, check and install
one adapter from disk. In bf16 on a CPU with AVX-512 BF16 the adapters' terms take one C call a
projection (kernels/lora_sgmv.py); `one_torch` and `each_torch` time the same steps on torch's
path (two matmuls an adapter, or the gather), for the kernel's ratio in the same run.
`forward_ms` times the layers alone (where the adapters' terms are): the head after them costs
more when random adapters flatten the logits (`--b-scale`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import RunnerHarness
from headrace.kernels import lora_sgmv as sgmv
from headrace.lora.manager import SITES

PROMPT_LEN = 64


def write_adapter(
    runner: ModelRunner, path: Path, rank: int, seed: int, b_scale: float = 1.0
) -> None:
    """A random PEFT adapter on every projection of every layer, in the model's shapes."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(runner.model.args.num_layers):
        for proj, (module, part) in SITES.items():
            linear: Any = runner.model.get_submodule(f"model.layers.{layer}.{module}")
            out, inp = linear.out_sizes[part], linear.in_features
            key = f"base_model.model.model.layers.{layer}.{module.split('.')[0]}.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) / inp**0.5
            b = torch.randn(out, rank, generator=gen) * (b_scale / rank)
            tensors[f"{key}.lora_B.weight"] = b
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(SITES)}
    (path / "adapter_config.json").write_text(json.dumps(config))


def decode_ms(runner: ModelRunner, lora_ids: list[int], steps: int) -> tuple[float, float]:
    """The median decode step, and the median forward through the layers within it (the
    adapters' terms are there; the head and the draw after it depend on the logits)."""
    harness = RunnerHarness(runner)
    forward, forwards = runner.model.forward, []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = forward(*args, **kwargs)
        forwards.append(time.perf_counter() - start)
        return out

    runner.model.forward = timed  # type: ignore[method-assign]
    try:
        return _decode_ms(harness, runner, lora_ids, steps, forwards)
    finally:
        del runner.model.forward  # the class's again


def _decode_ms(
    harness: RunnerHarness,
    runner: ModelRunner,
    lora_ids: list[int],
    steps: int,
    forwards: list[float],
) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    for i, lora_id in enumerate(lora_ids):
        prompt = torch.randint(10, runner.vocab_size, (PROMPT_LEN,), generator=gen).tolist()
        harness.add(str(i), prompt, steps + 2, lora_id=lora_id)
    harness.step()  # prefill, untimed
    harness.step()  # warm-up
    times = []
    forwards.clear()
    for _ in range(steps):
        start = time.perf_counter()
        harness.step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), 1000 * statistics.median(forwards)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = ModelConfig(model=args.model, dtype=args.dtype, max_lora_rank=max(args.rank, 1))
    runner = ModelRunner(model, CacheConfig(num_kv_blocks=args.rows * 8 + 64, block_size=16))
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rows):
            path = args.trained or Path(tmp) / str(i)
            if args.trained is None:
                write_adapter(runner, path, args.rank, seed=i, b_scale=args.b_scale)
            start = time.perf_counter()
            runner.loras.load(f"a{i}", path)
            loads.append(1000 * (time.perf_counter() - start))
    ids = [runner.loras.ids[f"a{i}"] for i in range(args.rows)]
    cases = {"plain": [0] * args.rows, "one": [ids[0]] * args.rows, "each": ids}
    cases |= {"one_torch": cases["one"], "each_torch": ids}
    ms: dict[str, list[float]] = {name: [] for name in cases}
    fw: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # alternating: the host's noise falls on all cases alike
        for name, lora_ids in cases.items():
            usable = sgmv.usable
            if name.endswith("_torch"):  # torch's matmuls, or its gather from 8 adapters on
                sgmv.usable = lambda x, y: False
                runner.loras.sgmv = False
            try:
                step, forward = decode_ms(runner, lora_ids, args.steps)
                ms[name].append(step)
                fw[name].append(forward)
            finally:
                sgmv.usable, runner.loras.sgmv = usable, sgmv.serves(runner.model.embed_weight)
    best = {name: min(values) for name, values in ms.items()}
    best_fw = {name: min(values) for name, values in fw.items()}
    others = [name for name in cases if name != "plain"]
    return {
        "model": runner.model_name, "dtype": str(runner.dtype).removeprefix("torch."),
        "rows": args.rows, "rank": args.rank,
        "b_scale": args.b_scale if args.trained is None else None,
        "trained": None if args.trained is None else str(args.trained),
        "step_ms": best, "forward_ms": best_fw,
        "ratio": {name: best[name] / best["plain"] for name in others},
        "ratio_forward": {name: best_fw[name] / best_fw["plain"] for name in others},
        "load_ms": statistics.median(loads),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF directory or GGUF (default: Gemma 3 270M)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--b-scale", type=float, default=1.0,
        help="B's scale: at 1 a random adapter's term is as large as the layer's own output, "
        "which flattens the logits (the greedy head then checks more candidates); 0.1 is "
        "nearer a trained adapter's small change",
    )  # fmt: skip
    p.add_argument(
        "--trained", type=Path, default=None,
        help="a PEFT adapter directory (bench/lora_train.py) loaded --rows times under as many "
        "names instead of random adapters: a trained adapter's size, each copy read on its own",
    )  # fmt: skip
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
