import math

import pytest

from headrace.request import FinishReason, RequestStatus, SamplingParams


def test_finished_states_map_to_finish_reasons() -> None:
    assert RequestStatus.FINISHED_TIMEOUT.finish_reason is FinishReason.TIMEOUT
    assert RequestStatus.FINISHED_LENGTH.finish_reason == "length"
    assert not RequestStatus.RUNNING.is_finished
    assert RequestStatus.RUNNING.finish_reason is None
    finished = [s for s in RequestStatus if s.is_finished]
    assert {s.finish_reason for s in finished} == set(FinishReason)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0}, {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1},
        {"temperature": math.nan}, {"temperature": math.inf}, {"temperature": -math.inf},
        {"temperature": "0.5"}, {"temperature": True}, {"top_p": math.nan}, {"top_p": math.inf},
        {"max_tokens": -5}, {"max_tokens": 1 << 40}, {"max_tokens": 8.0}, {"max_tokens": True},
        {"top_k": 2.5}, {"top_k": 1 << 40}, {"seed": 1.5}, {"seed": "7"}, {"seed": math.nan},
        {"seed": 1 << 80}, {"stop": ["x"]}, {"stop": (1,)}, {"stop_token_ids": (-1,)},
        {"stop_token_ids": (1.0,)}, {"ignore_eos": 1}, {"logprobs": 21}, {"logprobs": 1.0},
    ],
)  # fmt: skip
def test_bad_sampling_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_good_sampling_params_pass_and_tiny_temperatures_are_greedy() -> None:
    SamplingParams(max_tokens=(1 << 31) - 1, temperature=2, top_p=1, top_k=0, seed=-3, logprobs=0)
    SamplingParams(seed=(1 << 64) - 1, stop=("a", "b"), stop_token_ids=(0, 5), ignore_eos=True)
    assert SamplingParams(temperature=0).greedy and SamplingParams(temperature=1e-40).greedy
    assert not SamplingParams(temperature=1e-5).greedy
