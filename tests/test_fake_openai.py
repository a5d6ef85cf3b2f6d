"""The fake OpenAI server speaks the wire format the real clients expect (openai SDK, langchain-openai)."""

from __future__ import annotations

import asyncio

import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from tests.fakes.openai_server import EXTRACTION_MARKER, FakeOpenAI, Reply, ToolCall


def client(fake: FakeOpenAI, **kwargs: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0, **kwargs)  # type: ignore[arg-type]


async def test_streams_text_in_chunks_then_usage(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="Hello there, world", chunks=3))
    stream = await client(fake).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == "Hello there, world"
    assert len([p for p in pieces if p]) == 3
    assert finish == "stop"
    assert usage is not None and usage.total_tokens > 0


async def test_non_stream_and_default_echo(fake: FakeOpenAI) -> None:
    result = await client(fake).chat.completions.create(
        model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "ping"}]}]
    )
    assert result.choices[0].message.content == "echo: ping"
    assert result.choices[0].finish_reason == "stop"
    assert fake.requests[-1]["messages"][0]["content"][0]["text"] == "ping"


async def test_langchain_streams_tool_calls(fake: FakeOpenAI) -> None:
    fake.script(
        Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", '{"x": "y"}', id="c9")])
    )
    model = ChatOpenAI(base_url=fake.base_url, api_key="sk-test", model="m", streaming=True, max_retries=0)
    message = await model.ainvoke([HumanMessage("add")])
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("echo", {"x": "y"}),
    ]
    assert message.tool_calls[1]["id"] == "c9"
    assert message.response_metadata["finish_reason"] == "tool_calls"


async def test_langchain_non_stream_tool_calls(fake: FakeOpenAI) -> None:
    fake.script(Reply(tool_calls=[ToolCall("add", {"a": 1})]))
    model = ChatOpenAI(base_url=fake.base_url, api_key="sk-test", model="m", max_retries=0)
    message = await model.ainvoke("add")
    assert message.tool_calls[0]["args"] == {"a": 1}


async def test_rejects_unanswered_tool_calls_like_the_real_api(fake: FakeOpenAI) -> None:
    model = ChatOpenAI(base_url=fake.base_url, api_key="sk-test", model="m", max_retries=0)
    dangling = AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1", "type": "tool_call"}])
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        await model.ainvoke([HumanMessage("a"), dangling, HumanMessage("b")])
    answered = [HumanMessage("a"), dangling, ToolMessage("3", tool_call_id="c1"), HumanMessage("b")]
    assert (await model.ainvoke(answered)).content == "echo: b"


async def test_errors_with_retry_after(fake: FakeOpenAI) -> None:
    fake.script(Reply(status=429, retry_after=7), Reply(status=500))
    api = client(fake)
    with pytest.raises(openai.RateLimitError) as rate:
        await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert rate.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.InternalServerError):
        await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    assert (await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])).choices


async def test_a_dropped_stream_is_a_connection_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="abcdefgh", chunks=4, drop_after=2))
    stream = await client(fake).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    pieces: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")
    assert "".join(pieces) == "abcd"


async def test_first_byte_delay_trips_the_client_timeout(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="late", first_byte_delay=2))
    with pytest.raises(openai.APITimeoutError):
        await client(fake, timeout=0.2).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )


async def test_rules_and_demo_rules(fake: FakeOpenAI) -> None:
    fake.add_rule(lambda text: "weather" in text, Reply(text="sunny"))
    fake.add_demo_rules()
    api = client(fake)

    async def ask(text: str) -> str:
        done = await api.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        return done.choices[0].message.content or ""

    assert await ask("weather?") == "sunny"
    long = await ask("say something LONG")
    assert len(long) == 10_000 and "```python\n" in long and long.count("```") == 2
    with pytest.raises(openai.RateLimitError):
        await ask("FAIL429 please")
    fake.script(Reply(text="scripted wins"))
    assert await ask("weather?") == "scripted wins"
    assert await ask("anything else") == "echo: anything else"


async def test_slow_rule_streams_slowly_and_survives_a_client_that_leaves(fake: FakeOpenAI) -> None:
    fake.add_demo_rules()
    stream = await client(fake).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "SLOW"}], stream=True
    )
    first = await asyncio.wait_for(anext(aiter(stream)), 5)
    assert first.choices[0].delta.role == "assistant"
    await stream.close()  # a cancelled turn: the server must not mind
    assert (
        await client(fake).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    ).choices


def test_runs_in_a_thread_for_sync_clients() -> None:
    fake = FakeOpenAI.start_in_thread()
    try:
        fake.script(Reply(text="from a thread"))
        api = openai.OpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
        reply = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert reply.choices[0].message.content == "from a thread"
        assert fake.pending == 0 and len(fake.requests) == 1
    finally:
        fake.stop()


async def test_a_memory_extraction_never_takes_a_reply_scripted_for_a_turn(fake: FakeOpenAI) -> None:
    """The extraction runs in the background whenever the machine gets to it; a scripted reply is
    the next turn's (rules still answer extractions)."""
    from agent.memory import EXTRACTION_MARKER as AGENT_MARKER

    assert EXTRACTION_MARKER == AGENT_MARKER
    fake.script(Reply(text="for the turn"))
    api = client(fake)
    extraction = [{"role": "user", "content": f"{EXTRACTION_MARKER}\nfacts please"}]
    got = await api.chat.completions.create(model="m", messages=extraction)
    assert got.choices[0].message.content != "for the turn"
    turn = await api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert turn.choices[0].message.content == "for the turn"
