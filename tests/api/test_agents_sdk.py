"""The OpenAI Agents SDK (`openai-agents`), unmodified, running an agent against Headrace's
/v1/responses: two function tools, `tool_choice="required"` on the first turn (the SDK resets
it to auto after a call), the call's arguments validate and its result goes back, and the run
ends with a final answer — typed (`output_type`), so that random weights end it: under a JSON
schema the grammar closes the answer, where free text would run to the token limit. The tiny
model's seed is one whose greedy second turn answers rather than calls again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

from api.test_tools import CONTEXT

agents = pytest.importorskip("agents")

MODEL_SEED = 2


class Answer(BaseModel):
    answer: str = Field(max_length=20)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("agents")
    model = make_tiny_llama(tmp / "m", max_positions=CONTEXT, seed=MODEL_SEED)
    args = tiny_server_args(model) + ["--max-model-len", str(CONTEXT)]
    yield from serving(args, tmp, exits=(0,))


def test_an_agent_calls_a_tool_gets_its_result_and_answers(server: Server) -> None:
    agents.set_tracing_disabled(True)  # nothing leaves 127.0.0.1
    called: list[tuple[str, Any]] = []

    @agents.function_tool
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        called.append(("get_weather", city))
        return "sunny"

    @agents.function_tool
    def add(a: Annotated[int, Field(ge=0, le=99)], b: Annotated[int, Field(ge=0, le=99)]) -> int:
        """Add two numbers."""
        called.append(("add", (a, b)))
        return a + b

    async def run() -> Any:
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        settings = agents.ModelSettings(
            tool_choice="required", max_tokens=300, temperature=0, parallel_tool_calls=False
        )
        agent = agents.Agent(
            name="helper", instructions="Use the tools, then answer.", tools=[get_weather, add],
            model=agents.OpenAIResponsesModel(model="tiny", openai_client=client),
            model_settings=settings, output_type=Answer,
        )  # fmt: skip
        try:
            return await agents.Runner.run(agent, "Weather in Paris, and 2 + 3?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert called and all(name in ("get_weather", "add") for name, _ in called)
    assert isinstance(result.final_output, Answer)
