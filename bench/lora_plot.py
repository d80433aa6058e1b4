"""Draw `bench/lora.py`'s results: a decode step of 32 rows with adapters over a plain one.

One group of bars per adapter kind (random at `--b-scale 1`, at 0.1, trained), one bar per case
(one adapter for all rows / 32 adapters, `lora_sgmv` or torch's path), the whole step's ratio,
with the issue's targets (1.2x for one adapter, 1.3x for 32) as lines.

    .venv/bin/python bench/lora_plot.py docs/img/lora_bench_1206_b1.json \
        docs/img/lora_bench_1206_b01.json docs/img/lora_bench_1206_trained.json \
        --out docs/img/lora_bench_1206.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

CASES = {
    "one": "one adapter, lora_sgmv",
    "one_torch": "one adapter, torch",
    "each": "32 adapters, lora_sgmv",
    "each_torch": "32 adapters, torch's gather",
}


def label(doc: dict[str, object]) -> str:
    return "trained" if doc.get("trained") else f"random, --b-scale {doc['b_scale']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench/lora.py JSON files")
    p.add_argument("--out", type=Path, default=Path("bench/out/lora_bench.png"))
    args = p.parse_args()
    docs = [json.loads(path.read_text()) for path in args.runs]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(CASES)
    for k, (case, name) in enumerate(CASES.items()):
        xs = [i + (k - (len(CASES) - 1) / 2) * width for i in range(len(docs))]
        ax.bar(xs, [d["ratio"][case] for d in docs], width, label=name)
    ax.axhline(1.2, color="tab:blue", linestyle="--", linewidth=1, label="target, one adapter")
    ax.axhline(1.3, color="tab:green", linestyle="--", linewidth=1, label="target, 32 adapters")
    ax.set_xticks(range(len(docs)), [label(d) for d in docs])
    ax.set_ylabel("decode step of 32 rows / plain step")
    ax.set_title(f"{docs[0]['model']} ({docs[0]['dtype']}), rank {docs[0]['rank']} adapters")
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(json.dumps({"png": str(args.out)}))


if __name__ == "__main__":
    main()
