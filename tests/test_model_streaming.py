"""The model client's fast paths (agent/model.py) against the fake OpenAI server: streamed chunks
handed over as plain JSON give the same messages; structured output keeps the SDK's typed chunks;
agents no one watches call the model without streaming."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessageChunk, HumanMessage
from pydantic import BaseModel

from agent.config import AgentSettings, ModelSpec
from agent.model import Unstreamed, build_chat_model, unstreamed
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall


def model_for(fake: FakeOpenAI) -> Any:
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    return build_chat_model(spec, AgentSettings(model_timeout=5))


async def test_streamed_chunks_arrive_as_plain_json_with_the_same_message(fake: FakeOpenAI) -> None:
    model = model_for(fake)
    raw = await model.root_async_client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "x"}], stream=True
    )
    assert all([isinstance(chunk, dict) async for chunk in raw])

    fake.script(
        Reply(text="Hello there, **friend**", chunks=5),
        Reply(text="Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})]),
    )
    chunks = [c async for c in model.astream([HumanMessage("hi")])]
    assert len(chunks) >= 5 and all(isinstance(c, AIMessageChunk) for c in chunks)
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.text == "Hello there, **friend**"
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0
    assert whole.response_metadata.get("finish_reason") == "stop"

    called = await model.ainvoke([HumanMessage("add 2 and 3")])
    assert called.text == "Let me add."
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("add", {"a": 2, "b": 3})]


async def test_structured_output_keeps_the_sdks_typed_stream(fake: FakeOpenAI) -> None:
    class City(BaseModel):
        city: str

    fake.script(Reply(text='{"city": "Paris"}', chunks=4))
    structured = model_for(fake).with_structured_output(City, method="json_schema")
    answer = await structured.ainvoke("Where is the Louvre?")
    assert answer == City(city="Paris")
    assert fake.requests[-1]["stream"] is True and "response_format" in fake.requests[-1]


async def test_unwatched_calls_are_not_streamed(fake: FakeOpenAI) -> None:
    model = model_for(fake)
    fake.script(Reply(text="A title"), Reply(text="sub-agent report"))
    assert (await unstreamed(model).ainvoke("name this chat")).text == "A title"
    agent = create_agent(model, [], middleware=[Unstreamed()])
    result = await agent.ainvoke({"messages": [HumanMessage("do it")]})
    assert result["messages"][-1].text == "sub-agent report"
    assert [r.get("stream") for r in fake.requests] == [False, False]
