"""Fine-tune a rank-16 LoRA adapter on the embedded Gemma 3 270M, for the LoRA benches.

`bench/lora.py` and `bench/lora_serving.py` time random adapters; how much an adapter moves
the logits decides how many candidates the greedy head's screen keeps after the layers, so the
whole-step figures want an adapter whose size comes from training. This one comes from a short
fine-tune (peft, fp32, AdamW) on the project's own docs as plain text, on all seven projections;
it is a speed fixture, not a useful model. Prints JSON: the loss before and after and the mean
|B| per projection.

    .venv/bin/python bench/lora_train.py --out bench/out/lora_trained   # ~5 min on 2 cores
    .venv/bin/python bench/lora.py --trained bench/out/lora_trained
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from headrace.lora.manager import SITES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tests"))

from hf_gemma import load_hf_gemma  # noqa: E402  (the tests' load of the same reference model)


def batches(tokenizer: Any, seq: int, batch: int, steps: int) -> list[torch.Tensor]:
    text = "\n\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    ids = torch.tensor(tokenizer(text)["input_ids"])
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(ids) - seq, (steps, batch), generator=gen)
    return [torch.stack([ids[s : s + seq] for s in row.tolist()]) for row in starts]


def train(args: argparse.Namespace) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model, tokenizer = load_hf_gemma()
    config = LoraConfig(r=args.rank, lora_alpha=args.rank, target_modules=list(SITES))
    model = get_peft_model(model, config)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    data = batches(tokenizer, args.seq, args.batch, args.steps)
    losses, start = [], time.perf_counter()
    model.train()
    for x in data:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(float(loss.detach()))
    model.save_pretrained(args.out)
    return {
        "steps": args.steps, "seq": args.seq, "batch": args.batch, "lr": args.lr,
        "rank": args.rank, "loss_first10": statistics.mean(losses[:10]),
        "loss_last10": statistics.mean(losses[-10:]), "train_s": time.perf_counter() - start,
        "b_abs_mean": {proj: mean_abs(model, f"{proj}.lora_B") for proj in SITES},
        "out": str(args.out),
    }  # fmt: skip


def mean_abs(model: Any, name: str) -> float:
    """How large the trained weights named `name` came out: mean |w| over the layers."""
    values = [p.detach().abs().mean() for n, p in model.named_parameters() if name in n]
    return float(torch.stack(values).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/out/lora_trained"))
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seq", type=int, default=96)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    print(json.dumps(train(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
