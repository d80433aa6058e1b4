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
    [{"max_tokens": 0}, {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}],
)
def test_bad_sampling_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
