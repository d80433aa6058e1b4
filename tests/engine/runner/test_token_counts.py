"""The penalties counted on the device (runner/token_counts.py, CUDA's way and any step with a
token in flight): the same processed logits as the sparse way, a placeholder counted as the
token of the step in flight, and nothing outside the vocabulary."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from engine.logits_reference import reference
from engine.runner.test_logits_processors import CASES, EOS, OUTPUT, PROMPT, VOCAB, scheduled
from factories import DEVICES

from headrace.engine.runner.launched import LastTokens
from headrace.engine.runner.logits_processors import apply_processors
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.token_counts import ROWS_AT_ONCE, token_counts
from headrace.request import PENDING_TOKEN, SamplingParams


@pytest.mark.parametrize("device", DEVICES)
def test_counts_are_each_rows_and_skip_ids_outside_the_vocabulary(device: str) -> None:
    ids = [[5, 6, 5, 5], [], [VOCAB + 3, 7, PENDING_TOKEN], [1] * 9]
    last = torch.tensor([0, 0, 7, 0], device=device)
    counts = token_counts(ids, VOCAB, torch.device(device), last).cpu()
    assert counts.shape == (4, VOCAB)
    for row, want in enumerate([Counter(ids[0]), Counter(), Counter({7: 2}), Counter({1: 9})]):
        got = {t: int(c) for t, c in enumerate(counts[row].tolist()) if c}
        assert got == dict(want), row
    assert int(token_counts(ids[:2], VOCAB, torch.device(device))[0, 5]) == 3


def test_the_device_counts_give_the_sparse_ways_logits() -> None:
    """Every case, each with its own history, in a batch past ROWS_AT_ONCE rows (counted a
    block of rows at a time): `last` (no placeholder in any history) takes the dense way on
    the CPU too. Equal to the sign of a zero, which neither a pick nor a draw tells apart."""
    n = 2 * ROWS_AT_ONCE + 3
    raw = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    reqs = [scheduled(str(i), CASES[i % len(CASES)], PROMPT, OUTPUT[: 2 + i % 5]) for i in range(n)]
    sparse = apply_processors(raw.clone(), reqs)
    dense = apply_processors(raw.clone(), reqs, torch.zeros(len(reqs), dtype=torch.int64))
    assert torch.equal(sparse, dense)


def test_a_placeholder_counts_as_the_token_of_the_step_in_flight() -> None:
    params = SamplingParams(repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3)
    raw = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(6)) * 3
    flying = scheduled("r", params, PROMPT, [*OUTPUT, PENDING_TOKEN])
    got = apply_processors(raw.clone(), [flying], torch.tensor([11]))[0]
    want = reference(raw[0], params, PROMPT, [*OUTPUT, 11], (EOS,))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_sampler_takes_the_launched_steps_token_by_request() -> None:
    """A history ending in a placeholder draws its token from the runner's LastTokens; without
    one launched the sampler refuses by name."""
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    raw = torch.zeros(2, VOCAB)
    raw[:, 11] = 1.0  # the likeliest, until counted
    reqs = [
        scheduled("a", params, PROMPT, [4, PENDING_TOKEN]),
        scheduled("b", params, PROMPT, [4, 12]),
    ]
    sampler = Sampler()
    with pytest.raises(ValueError, match="request a: a pending token"):
        sampler.pick(raw, reqs)
    last = LastTokens()
    sampler.in_flight = last.tokens_of
    with pytest.raises(ValueError, match="request a: a pending token no launched step"):
        sampler.pick(raw, reqs)
    last.keep(["z", "a"], torch.tensor([3, 11]))
    picks = sampler.pick(raw, reqs).tolist()
    assert picks[0] != 11 and picks[1] == 11  # a's 11 in flight is counted; b never had it
