"""The adapters a runner holds: loaded into every projection they target, by a load-unique id.

Loading checks the whole adapter against the model before it changes anything, so a malformed
or mismatched adapter leaves what is loaded as it was. Each load gets a new id (never reused):
the prefix cache is salted with it, so even an adapter reloaded under the same name with other
weights never meets KV computed by the old one. With `--max-cpu-loras`, an adapter evicted from
memory and read again keeps its id while its files are the same (same digest), and gets a new
one when they changed (registry.py).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from headrace.kernels import lora_sgmv
from headrace.layers.linear import MergedLinear
from headrace.layers.lora import GATHER_MIN_GROUPS, LoraBatch, LoraDelta, Rows, Segments
from headrace.lora.adapter import LoraAdapter, read_adapter
from headrace.lora.names import LoraError
from headrace.lora.registry import Registered, Registry
from headrace.models.base import CausalLM

log = logging.getLogger(__name__)
# Hugging Face projection -> (our module under `model.layers.N`, its part of a merged matmul)
SITES: dict[str, tuple[str, int]] = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
Segment = tuple[int, int, int]  # (adapter id, first row, one past the last row)
Planned = list[tuple[MergedLinear, torch.Tensor, torch.Tensor]]


class LoraManager:
    def __init__(self, model: CausalLM, max_rank: int = 64) -> None:
        self.model = model
        self.max_rank = max_rank
        self.batch = LoraBatch()
        self.registry = Registry()
        self._next_id = 1  # 0 is the base model
        # lora_sgmv serves this model's projections (bf16 on the CPU): no gather index needed;
        # decided once, not per step
        self.sgmv = lora_sgmv.serves(model.embed_weight)

    @property
    def ids(self) -> dict[str, int]:
        """Every registered adapter, its weights in memory or not: name -> id."""
        return self.registry.ids

    def load(self, name: str, path: str | Path, keep: Collection[int] = ()) -> int:
        """Read, check, register and install an adapter; its id. LoraError: nothing changed.
        With `max_resident` adapters in memory, the least recently used one not in `keep`
        makes room; if all are kept, this one stays on disk until a request needs it."""
        if name in self.ids:
            raise LoraError(f"adapter {name!r} is already loaded")
        adapter, planned = self._read(name, path)
        adapter_id = self._new_id()
        self.registry.add(adapter_id, Registered(name, adapter.path, adapter.digest))
        victims = self.registry.victims(keep, 1)
        if victims is not None:
            self._evict(victims)
            self._install(adapter_id, planned)
        log.info("LoRA adapter %s: rank %d, %d projections", name, adapter.rank, len(planned))
        return adapter_id

    def unload(self, name: str) -> None:
        resident = name in self.ids and self.registry.is_resident(self.ids[name])
        adapter_id = self.registry.remove(name)
        if adapter_id is None:
            raise LoraError(f"adapter {name!r} is not loaded")
        if resident:
            self._uninstall(adapter_id)

    def ensure_resident(self, adapter_id: int, keep: Collection[int]) -> int | None:
        """Make a registered adapter's weights resident, reading its files again (the checks
        of a first load) after evicting the least recently used adapter not in `keep`.
        Returns its id: the same, or a new one when its files changed since they were read
        (KV computed with other weights is never reused); None when every resident adapter
        is kept (no room now). LoraError: its files cannot be read or checked any more."""
        entry = self.registry.by_id.get(adapter_id)
        if entry is None:
            raise LoraError(f"adapter id {adapter_id} is not loaded (unloaded meanwhile?)")
        if self.registry.is_resident(adapter_id):
            return adapter_id
        victims = self.registry.victims(keep, 1)
        if victims is None:
            return None
        self._evict(victims)  # before the read: never more than max_resident in memory
        adapter, planned = self._read(entry.name, entry.path)
        if adapter.digest != entry.digest:
            log.warning("LoRA adapter %s: its files changed on disk; served anew", entry.name)
            old, adapter_id = adapter_id, self._new_id()
            self.registry.rekey(old, adapter_id)
            entry.digest = adapter.digest
        self._install(adapter_id, planned)
        return adapter_id

    def set_max_resident(self, n: int | None) -> None:
        """At most `n` adapters in memory from now (None: all); evicts the surplus."""
        self.registry.max_resident = n
        self._evict(self.registry.victims((), 0) or [])

    def id_of(self, name: str | None) -> int:
        """0 for the base model (None); LoraError for an adapter not loaded."""
        if name is None:
            return 0
        adapter_id = self.ids.get(name)
        if adapter_id is None:
            raise LoraError(f"adapter {name!r} is not loaded")
        return adapter_id

    def set_rows(self, segments: Sequence[Segment]) -> None:
        """The next forward's rows per adapter (base rows are left out)."""
        by_id: dict[int, list[tuple[int, int]]] = {}
        for adapter_id, start, end in segments:
            if not self.registry.is_resident(adapter_id):
                raise LoraError(
                    f"adapter id {adapter_id} is not loaded, or not in memory (unloaded meanwhile?)"
                )
            by_id.setdefault(adapter_id, []).append((start, end))
        self.registry.touch(by_id)
        device = self.model.embed_weight.device
        self.batch.groups = [(i, _rows(spans, device)) for i, spans in by_id.items()]
        self.batch.slots = {}
        # lora_sgmv's rows where it serves the projections, else torch's gather from 8 adapters
        self.batch.segments = _segments(by_id) if by_id and self.sgmv else None
        gather = len(by_id) >= GATHER_MIN_GROUPS and not self.sgmv
        self.batch.gathered = _gathered(by_id, device) if gather else None

    def _new_id(self) -> int:
        adapter_id, self._next_id = self._next_id, self._next_id + 1
        return adapter_id

    def _read(self, name: str, path: str | Path) -> tuple[LoraAdapter, Planned]:
        adapter = read_adapter(name, path, self.max_rank)
        planned = self._plan(adapter)
        self.registry.read(name)
        return adapter, planned

    def _install(self, adapter_id: int, planned: Planned) -> None:
        for linear, a, b in planned:
            if linear.lora is None:
                linear.lora = LoraDelta(self.batch)
            linear.lora.put(adapter_id, a, b)
        self.registry.installed(adapter_id)

    def _evict(self, victims: list[int]) -> None:
        for adapter_id in victims:
            self._uninstall(adapter_id)
            self.registry.evicted(adapter_id)
            log.info("LoRA adapter id %d evicted from memory (still registered)", adapter_id)

    def _uninstall(self, adapter_id: int) -> None:
        for module in self.model.modules():
            if isinstance(module, MergedLinear) and module.lora is not None:
                module.lora.drop(adapter_id)

    def _plan(self, adapter: LoraAdapter) -> Planned:
        """Each targeted projection's A [in, R] and scaled B [R, out], checked against the
        model: a layer or shape of another model is refused before anything is installed."""
        parts: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for (layer, proj), pair in adapter.weights.items():
            if layer >= self.model.args.num_layers:
                raise LoraError(
                    f"adapter {adapter.name!r}: layer {layer} is past the model's "
                    f"{self.model.args.num_layers} layers (an adapter of another model?)"
                )
            module, part = SITES[proj]
            parts.setdefault(f"model.layers.{layer}.{module}", {})[part] = pair
        return [self._stack(adapter, path, by_part) for path, by_part in parts.items()]

    def _stack(
        self, adapter: LoraAdapter, path: str, by_part: dict[int, tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[MergedLinear, torch.Tensor, torch.Tensor]:
        linear = self.model.get_submodule(path)
        assert isinstance(linear, MergedLinear)
        a_parts, b_parts = [], []
        for part, (a, b) in sorted(by_part.items()):
            want_out = linear.out_sizes[part]
            if a.shape[1] != linear.in_features or b.shape[0] != want_out:
                raise LoraError(
                    f"adapter {adapter.name!r}: {path} part {part}: A {tuple(a.shape)}, "
                    f"B {tuple(b.shape)} do not fit [r, {linear.in_features}], "
                    f"[{want_out}, r] (an adapter of another model?)"
                )
            full = torch.zeros(b.shape[1], sum(linear.out_sizes))  # [r, sum(out)]
            full[:, linear.shard_slice(part)] = b.t() * adapter.scaling
            a_parts.append(a.t())
            b_parts.append(full)
        weight = linear.weight
        a_cat = torch.cat(a_parts, dim=1).to(weight.device, weight.dtype)  # [in, R]
        b_cat = torch.cat(b_parts, dim=0).to(weight.device, weight.dtype)  # [R, sum(out)]
        return linear, a_cat.contiguous(), b_cat.contiguous()


def _rows(spans: list[tuple[int, int]], device: torch.device) -> Rows:
    if len(spans) == 1:
        return slice(*spans[0])
    index = torch.cat([torch.arange(s, e, dtype=torch.int64) for s, e in spans])
    return index.to(device)


def _segments(by_id: dict[int, list[tuple[int, int]]]) -> Segments:
    """The adapter ids in group order, every adapter row, each group's start, the rows the
    step must have (LoraBatch.segments)."""
    rows = [r for spans in by_id.values() for s, e in spans for r in range(s, e)]
    off = [0]
    for spans in by_id.values():
        off.append(off[-1] + sum(e - s for s, e in spans))
    every_row = torch.tensor(rows, dtype=torch.int64)
    return tuple(by_id), every_row, torch.tensor(off, dtype=torch.int64), max(rows) + 1


def _gathered(
    by_id: dict[int, list[tuple[int, int]]], device: torch.device
) -> tuple[torch.Tensor, list[int]]:
    """Every adapter row's index and its adapter's id, group by group (LoraBatch.gathered)."""
    rows = [r for spans in by_id.values() for s, e in spans for r in range(s, e)]
    ids = [i for i, spans in by_id.items() for s, e in spans for _ in range(s, e)]
    return torch.tensor(rows, dtype=torch.int64, device=device), ids
