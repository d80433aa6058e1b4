"""Workloads: what each benchmark request asks for (prompt, output length, tenant).

Prompts are made of plain, common English words picked by a seeded generator, so that any
tokenizer encodes them at about one token per word, and no two prompts share a long prefix
(a prefix cache cannot make the benchmark look better than real traffic). Request `i` of a
workload depends only on the seed and `i`: a sweep sends the same requests at every level.

Kinds:
- `fixed`: every request has `prompt_len` words and asks for `output_len` tokens.
- `uniform`: prompt and output lengths drawn uniformly from `[lo, hi]` ranges.
- `mix`: a realistic mixture of three request classes (see `MIX_CLASSES`), with log-normal
  lengths: chat turns (55%: short prompts, medium answers), retrieval / summarisation (25%: long
  prompts, short answers) and code / long-form completion (20%: medium prompts, long answers).
  Mean prompt ≈ 330 words, mean output ≈ 125 tokens, close to published chat-trace statistics.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

_WORD_TEXT = (
    "the of and to in is was for on are with as at be by this from have or had not but what "
    "all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no "
    "make than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know get through back much before go "
    "good new write our used me man too any day same right look think also around another came "
    "come work three word must because does part even place well such here take why things help "
    "put years different away again off went old number great tell men say small every found "
    "still between name should home big give air line set own under read last never us left end "
    "along while might next sound below saw something thought both few those always looked show "
    "large often together asked house world going want school important until form food keep "
    "children feet land side without boy once animals life enough took sometimes four head above "
    "kind began almost live page got earth need far hand high year mother light parts country"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Tenant:
    """One tenant of a multi-tenant mix: its API key, tier and share of the requests."""

    name: str
    api_key: str | None = None
    tier: str = "default"
    share: float = 1.0


@dataclass(frozen=True)
class RequestSpec:
    index: int
    prompt: str
    prompt_words: int
    max_tokens: int
    tenant: Tenant | None = None
    kind: str = ""


@dataclass(frozen=True)
class LengthClass:
    """A log-normal length distribution: `median * exp(sigma * N(0, 1))`, clipped."""

    median: float
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: random.Random) -> int:
        value = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return int(min(self.hi, max(self.lo, round(value))))


@dataclass(frozen=True)
class MixClass:
    name: str
    weight: float
    prompt: LengthClass
    output: LengthClass


MIX_CLASSES = (
    MixClass("chat", 0.55, LengthClass(80, 0.8, 8, 1024), LengthClass(128, 0.7, 8, 512)),
    MixClass("rag", 0.25, LengthClass(768, 0.5, 128, 3072), LengthClass(64, 0.6, 8, 256)),
    MixClass("code", 0.20, LengthClass(256, 0.6, 16, 1024), LengthClass(256, 0.5, 16, 1024)),
)


@dataclass(frozen=True)
class Workload:
    """A reproducible stream of requests; `kind` is `fixed`, `uniform` or `mix`."""

    kind: str = "fixed"
    prompt_len: tuple[int, int] = (128, 128)
    output_len: tuple[int, int] = (64, 64)
    seed: int = 0
    max_len: int | None = None  # cap on prompt words + output tokens (the model's context)
    tenants: tuple[Tenant, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "mix"):
            raise ValueError(f"unknown workload {self.kind!r}: use fixed, uniform or mix")
        for name, (lo, hi) in (("prompt", self.prompt_len), ("output", self.output_len)):
            if lo < 1 or hi < lo:
                raise ValueError(f"{name} length range must satisfy 1 <= lo <= hi, got {lo}:{hi}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError("max_len must be at least 2")
        if self.tenants and sum(t.share for t in self.tenants) <= 0:
            raise ValueError("tenant shares must add up to more than 0")

    def request(self, index: int) -> RequestSpec:
        rng = random.Random(f"{self.seed}:{index}")
        kind, prompt_words, max_tokens = self._lengths(rng)
        if self.max_len is not None:
            max_tokens = min(max_tokens, max(1, self.max_len // 2))
            prompt_words = max(1, min(prompt_words, self.max_len - max_tokens))
        return RequestSpec(
            index=index,
            prompt=make_prompt(rng, prompt_words),
            prompt_words=prompt_words,
            max_tokens=max_tokens,
            tenant=self._tenant(rng),
            kind=kind,
        )

    def _lengths(self, rng: random.Random) -> tuple[str, int, int]:
        if self.kind == "mix":
            cls = rng.choices(MIX_CLASSES, weights=[c.weight for c in MIX_CLASSES])[0]
            return cls.name, cls.prompt.sample(rng), cls.output.sample(rng)
        prompt = rng.randint(*self.prompt_len)
        output = rng.randint(*self.output_len)
        return self.kind, prompt, output

    def _tenant(self, rng: random.Random) -> Tenant | None:
        if not self.tenants:
            return None
        return rng.choices(self.tenants, weights=[t.share for t in self.tenants])[0]

    def describe(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "prompt_len": list(self.prompt_len),
            "output_len": list(self.output_len),
            "seed": self.seed,
            "max_len": self.max_len,
            "tenants": [{"name": t.name, "tier": t.tier, "share": t.share} for t in self.tenants],
        }


def make_prompt(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def parse_range(text: str) -> tuple[int, int]:
    """`"128"` -> (128, 128); `"16:512"` (or `16-512`) -> (16, 512)."""
    parts = text.replace("-", ":").split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"not a length or a lo:hi range: {text!r}") from None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    raise ValueError(f"not a length or a lo:hi range: {text!r}")


def load_tenants(path: str) -> tuple[Tenant, ...]:
    """Read a tenants file (YAML or JSON): `tenants: [{name, api_key, tier, share}, ...]`."""
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    items = data.get("tenants") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty list under 'tenants'")
    tenants = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"{path}: tenant #{i} needs at least a 'name'")
        share = float(item.get("share", 1.0))
        if share < 0:
            raise ValueError(f"{path}: tenant {item['name']!r} has a negative share")
        key = item.get("api_key")
        tenants.append(
            Tenant(
                name=str(item["name"]),
                api_key=None if key is None else str(key),
                tier=str(item.get("tier", "default")),
                share=share,
            )
        )
    return tuple(tenants)
