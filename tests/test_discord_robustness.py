"""Discord field reliability, through discord.py against FakeDiscord: a MESSAGE_CREATE discord.py
cannot parse never drops the connection, non-text posts get a visible outcome, 5xx is not fatal.

Outcomes are asserted as the user sees them, with the real gateway and an echo harness.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import pytest

from channels.base import ChannelState
from channels.discord import DiscordChannel
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants

USER = "900000000000000042"

# The adapter points discord.py's process-wide class attributes at the fake.
pytestmark = pytest.mark.usefixtures("discord_endpoints_restored")


@pytest.fixture
def dc_heartbeat() -> float:
    return 0.5  # the stalled-connection tests time out after 1.5 s


@pytest.fixture
def allowed_users() -> list[str]:
    return [USER]


@pytest.fixture
def channel(dc: FakeDiscord) -> DiscordChannel:
    return DiscordChannel(dc.token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url)


def says(dc: FakeDiscord, needle: str) -> list[str]:
    return [m.content for m in dc.bot_messages() if needle in (m.content or "")]


# -- malformed MESSAGE_CREATE --------------------------------------------------------------------
MALFORMED: dict[str, dict[str, Any]] = {
    "no content": {"drop": ("content",)},
    "attachments is a string": {"override": {"attachments": "secret words"}},
    "content is an object": {"override": {"content": {"secret": "words"}}},
    "mentions is a string": {"override": {"mentions": "secret words"}},
}


@pytest.mark.parametrize("shape", list(MALFORMED))
async def test_malformed_message_is_skipped_and_its_sender_told(
    shape: str, dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(channel, adapter_rig):
        connections = (dc.identifies, dc.resumes)
        await dc.inject_dm(USER, "first good one")
        bad = await dc.inject_malformed(USER, **MALFORMED[shape])
        await dc.inject_dm(USER, "second good one")
        await dc.wait_for(lambda: says(dc, "echo: second good one"), 10)
        notes = await dc.wait_for(lambda: says(dc, "couldn't read that message"), 10)
        assert says(dc, "echo: first good one")
        assert channel.state is ChannelState.CONNECTED and (dc.identifies, dc.resumes) == connections, (
            "no reconnect"
        )
    assert len(notes) == 1
    (note,) = [m for m in dc.bot_messages() if "couldn't read" in (m.content or "")]
    assert note.channel_id == bad["channel_id"]
    assert note.reply_to is None, "no quote: Discord would echo the unreadable original back"
    assert adapter_rig.metric("chital_messages_ignored_total", channel="discord", reason="malformed") == 1
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and bad["id"] in critical[0] and bad["channel_id"] in critical[0]
    for record in caplog.records:
        assert "secret" not in record.getMessage() + (record.exc_text or ""), record.getMessage()


@pytest.mark.parametrize(
    "broken",
    [{"drop": ("author",)}, {"drop": ("id",)}, {"drop": ("channel_id",)}, {"override": {"author": "x"}}],
)
async def test_message_without_recoverable_sender_is_only_counted(
    broken: dict[str, Any], dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        connections = (dc.identifies, dc.resumes)
        await dc.inject_malformed(USER, **broken)
        await dc.inject_dm(USER, "after it")
        await dc.wait_for(lambda: says(dc, "echo: after it"), 10)
        assert channel.state is ChannelState.CONNECTED and (dc.identifies, dc.resumes) == connections
    assert not says(dc, "couldn't read")
    assert adapter_rig.metric("chital_messages_ignored_total", channel="discord", reason="malformed") == 1


# -- non-text posts ------------------------------------------------------------------------------
NOW = dt.datetime.now(dt.UTC).isoformat()
POLL = {"question": {"text": "Lunch?"}, "expiry": NOW, "allow_multiselect": False, "layout_type": 1,
        "answers": [{"answer_id": 1, "poll_media": {"text": "pizza"}},
                    {"answer_id": 2, "poll_media": {"text": "sushi"}}]}  # fmt: skip
SNAPSHOT = {"message": {"content": "the deploy is done", "embeds": [], "attachments": [], "type": 0, "timestamp": NOW,
                        "edited_timestamp": None, "flags": 0, "mentions": [], "mention_roles": [], "components": []}}  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "agent_reads"),
    [
        ({"poll": POLL}, "📊 poll: Lunch?\n- pizza\n- sushi"),
        ({"embeds": [{"type": "rich", "title": "Status", "description": "all green", "url": "https://s.example"}]},
         "(embed) Status — all green (https://s.example)"),
        ({"message_snapshots": [SNAPSHOT],
          "message_reference": {"type": 1, "message_id": "1", "channel_id": "2"}},
         "(forwarded message) the deploy is done"),
    ],
    ids=["poll", "embed", "forward"],
)  # fmt: skip
async def test_usable_non_text_posts_become_text(
    fields: dict[str, Any], agent_reads: str, dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        await dc.inject_dm(USER, "", fields=fields)
        await dc.wait_for(lambda: says(dc, "echo: "), 10)
    assert adapter_rig.harness.seen == [(agent_reads, [])]
    # A forward is someone else's words: the turn carries that provenance (agent/provenance.py).
    forwarded = [s.describe() for s in adapter_rig.harness.calls[-1].options.provenance]
    assert forwarded == (["a message by someone (forwarded)"] if "message_snapshots" in fields else [])


async def test_sticker_gets_a_plain_note(dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig) -> None:
    async with running(channel, adapter_rig):
        mid = await dc.inject_dm(
            USER, "", fields={"sticker_items": [{"id": "5", "name": "wave", "format_type": 1}]}
        )
        (note,) = await dc.wait_for(lambda: dc.bot_messages(), 10)
    assert note.content == "I can't use stickers yet; please describe what you need in words."
    assert note.reply_to == mid and adapter_rig.harness.seen == []


async def test_voice_message_reaches_the_agent_as_a_file(
    dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        await dc.inject_dm(USER, "", attachments=[("voice-message.ogg", b"OggS" + b"\0" * 60, "audio/ogg")],
                             fields={"flags": 1 << 13})  # fmt: skip
        (reply,) = await dc.wait_for(lambda: says(dc, "echo: "), 10)
    assert reply.endswith("[files: voice-message.ogg]")


async def test_sticker_chatter_in_a_guild_is_not_answered(
    dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        await dc.inject_message(
            None, USER, "", fields={"sticker_items": [{"id": "5", "name": "w", "format_type": 1}]}
        )
        await dc.inject_message(None, USER, "hello", mention_bot=True)
        await dc.wait_for(lambda: says(dc, "echo: hello"), 10)
    assert [m.content for m in dc.bot_messages()] == ["echo: hello"]


# -- fatal vs transient ---------------------------------------------------------------------------
async def test_login_5xx_is_retried_and_401_is_fatal(dc: FakeDiscord, channel: DiscordChannel) -> None:
    # discord.py itself retries a 502 after 1 s; a 503 it raises at once: the supervisor retries.
    dc.fail_next(503, method="GET", path_contains="/users/@me", times=2)
    dc.fail_next(502, method="GET", path_contains="/users/@me", times=1)
    sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await dc.wait_for(lambda: channel.state is ChannelState.CONNECTED, 20)
        assert len([p for _m, p in dc.rest_calls if p.endswith("/users/@me")]) == 4
    finally:
        await sup.stop()

    revoked = DiscordChannel("revoked-token", api_base_url=dc.api_base_url, gateway_url=dc.gateway_url)
    sup = ChannelSupervisor(revoked, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await dc.wait_for(lambda: revoked.state is ChannelState.FAILED, 10)
        assert "rejected the bot token" in (revoked.reason or "")
    finally:
        await sup.stop()


# -- table-driven malformed variants (channels/malformed.py) ---------------------------------------
MESSAGE_CASES = variants({
    ("content",): (("missing", "object", "number", "list", "null"), True),
    ("author",): (("missing", "string", "null"), False),
    ("author", "id"): (("null", "object", "huge id"), False),
    ("channel_id",): (("missing", "object"), False),
    ("id",): (("missing", "object"), False),
    ("attachments",): (("string", "number", "nested nulls"), True),
    ("mentions",): (("string", "object"), True),
    ("embeds",): (("string", "number"), True),
})  # fmt: skip
INTERACTION_CASES = variants({
    ("data",): (("null", "string", "missing"), True),
    ("data", "custom_id"): (("missing", "number", "null", "huge id"), True),
    ("type",): (("number",), True),
    ("user",): (("missing", "string"), True),
    ("channel_id",): (("missing", "object"), True),
    ("id",): (("missing", "string"), False),
    ("token",): (("missing", "number"), False),
})  # fmt: skip


async def serves_after(dc: FakeDiscord) -> None:
    await dc.inject_dm(USER, "still there?")
    await dc.wait_for(lambda: says(dc, "echo: still there?"), 10)


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=lambda c: c.id)
async def test_every_malformed_message_is_counted_answered_and_keeps_the_connection(
    case: Case, dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(channel, adapter_rig):
        connections = (dc.identifies, dc.resumes)
        await dc.inject_raw("MESSAGE_CREATE", put(dc.message_template(USER, SECRET), case.path, case.value))
        if case.told:
            await dc.wait_for(lambda: says(dc, "couldn't read that message"), 10)
        await serves_after(dc)
        assert channel.state is ChannelState.CONNECTED
        assert (dc.identifies, dc.resumes) == connections, "no reconnect"
    assert malformed_total(adapter_rig, "discord") == 1
    assert bool(says(dc, "couldn't read")) is case.told
    assert not leaked(caplog.records)


@pytest.mark.parametrize("case", INTERACTION_CASES, ids=lambda c: c.id)
async def test_every_malformed_interaction_is_counted_and_answered(
    case: Case, dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(channel, adapter_rig):
        connections = (dc.identifies, dc.resumes)
        template = dc.interaction_template(USER)
        await dc.inject_interaction(put(template, case.path, case.value))
        if case.told:
            await dc.wait_for(lambda: dc.interaction_responses, 10)
        await serves_after(dc)
        assert (dc.identifies, dc.resumes) == connections, "no reconnect"
    assert malformed_total(adapter_rig, "discord") == 1
    answers = list(dc.interaction_responses.values())
    assert bool(answers) is case.told
    for answer in answers:
        content = answer["data"]["content"]
        assert "couldn't read that button" in content or "can't handle that" in content
        assert answer["data"]["flags"] & 64, "ephemeral: only the presser sees it"
    assert not leaked(caplog.records)


async def test_a_modal_interaction_is_refused(
    dc: FakeDiscord, channel: DiscordChannel, adapter_rig: Rig
) -> None:
    # (Application commands are taken since issue 24: tests/test_menus_discord.py. A modal the
    # bot never offered is refused as an unknown interaction.)
    async with running(channel, adapter_rig):
        command = dc.interaction_template(USER)
        command.update(type=5, data={"custom_id": "chital:form", "components": []})
        await dc.inject_interaction(command)
        await dc.wait_for(lambda: dc.interaction_responses, 10)
        await serves_after(dc)
    (answer,) = dc.interaction_responses.values()
    assert "can't handle that" in answer["data"]["content"]
    assert adapter_rig.metric("chital_malformed_events_total", platform="discord", kind="interaction") == 1
