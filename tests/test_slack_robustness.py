"""Slack field reliability, through slack-bolt / slack_sdk against FakeSlack: malformed envelopes and
events are skipped and acked, non-text posts get a visible outcome, transient errors are not fatal.

Outcomes are asserted as the user sees them, with the real gateway and an echo harness.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from channels.base import ChannelState, FatalChannelError
from channels.slack import SlackChannel
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor, run_once
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.slack_server import FakeSlack

ALICE = "U_ALICE"


@pytest.fixture
def allowed_users() -> list[str]:
    return [ALICE]


DM = "D_ALICE"


@pytest.fixture
def channel(slack: FakeSlack) -> SlackChannel:
    return SlackChannel(slack.bot_token, slack.app_token, api_base_url=slack.api_base_url, ping_interval=0.5)


def dm_event(slack: FakeSlack, **fields: Any) -> dict[str, Any]:
    event = {"type": "message", "user": ALICE, "text": "secret words", "ts": slack.next_ts(), "channel": DM,
             "channel_type": "im"}  # fmt: skip
    event.update(fields)
    return {k: v for k, v in event.items() if v is not None}


def says(slack: FakeSlack, needle: str, channel: str = DM) -> list[str]:
    return [t for t in slack.texts(channel) if needle in t]


# -- malformed events and envelopes --------------------------------------------------------------
MALFORMED_EVENTS: dict[str, dict[str, Any]] = {
    "text is an object": {"text": {"secret": "words"}},
    "files is a string": {"files": "secret words", "subtype": "file_share"},
    "thread_ts is a number": {"thread_ts": 12.5},
}


@pytest.mark.parametrize("shape", list(MALFORMED_EVENTS))
async def test_malformed_event_is_skipped_acked_and_its_sender_told(
    shape: str, slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(channel, adapter_rig):
        first = await slack.inject_dm(DM, ALICE, "first good one")
        bad = await slack.send_event(dm_event(slack, **MALFORMED_EVENTS[shape]))
        second = await slack.inject_dm(DM, ALICE, "second good one")
        await slack.wait_for(lambda: says(slack, "echo: first good one"))
        await slack.wait_for(lambda: says(slack, "echo: second good one"))
        notes = await slack.wait_for(lambda: says(slack, "couldn't read that message"))
        await slack.wait_for(lambda: all(slack.is_acked(e) for e in (first.envelope, bad, second.envelope)))
        assert channel.state is ChannelState.CONNECTED
    assert len(notes) == 1
    assert adapter_rig.metric("chital_messages_ignored_total", channel="slack", reason="malformed") == 1
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and DM in critical[0] and bad["payload"]["event_id"] in critical[0]
    for record in caplog.records:
        assert "secret" not in record.getMessage() + (record.exc_text or ""), record.getMessage()


async def test_malformed_envelopes_are_acked_and_counted(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        good = await slack.send_event(dm_event(slack, text="good one"))
        template = await slack.send_event(dm_event(slack, text="template"))
        no_event = {
            **template,
            "envelope_id": "env-no-event",
            "payload": {**template["payload"], "event": None},
        }
        string_event = {
            **template,
            "envelope_id": "env-str",
            "payload": {**template["payload"], "event": "x"},
        }
        no_type = {**template, "envelope_id": "env-no-type",
                   "payload": {**template["payload"], "event": {"user": ALICE, "channel": DM}}}  # fmt: skip
        string_payload = {**template, "envelope_id": "env-str-payload", "payload": "secret words"}
        no_payload = {k: v for k, v in template.items() if k != "payload"} | {"envelope_id": "env-no-payload"}
        user_missing = await slack.send_event(dm_event(slack, user=None))
        for envelope in (no_event, string_event, no_type, string_payload, no_payload):
            await slack.send_envelope(envelope)
        after = await slack.send_event(dm_event(slack, text="after them"))
        every = (
            good,
            template,
            no_event,
            string_event,
            no_type,
            string_payload,
            no_payload,
            user_missing,
            after,
        )
        await slack.wait_for(lambda: all(slack.is_acked(e) for e in every))
        await slack.wait_for(lambda: says(slack, "echo: after them"))
    assert says(slack, "echo: good one") and says(slack, "echo: template")
    assert not says(slack, "couldn't read"), "no sender could be recovered: nobody to tell"
    # the envelope with no payload never reaches bolt; the other five are counted by the gateway
    assert adapter_rig.metric("chital_messages_ignored_total", channel="slack", reason="malformed") == 6
    assert channel.unreadable_events == 6


# -- non-text posts ------------------------------------------------------------------------------
async def test_file_share_without_text_reaches_the_agent(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    shared = slack.add_file("notes.txt", b"hello", "text/plain")
    async with running(channel, adapter_rig):
        await slack.inject_dm(DM, ALICE, "", files=[shared])
        (reply,) = await slack.wait_for(lambda: slack.texts(DM))
    assert reply.startswith("echo: ") and reply.endswith("[files: notes.txt]")
    assert adapter_rig.harness.seen[0][1] == ["/mnt/user-data/uploads/notes.txt"]


async def test_file_slack_will_not_serve_gets_a_note(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    hidden = {"id": "F_HIDDEN", "mode": "hidden_by_limit"}
    async with running(channel, adapter_rig):
        await slack.send_event(dm_event(slack, text="", files=[hidden], subtype="file_share"))
        (reply,) = await slack.wait_for(lambda: slack.texts(DM))
    assert reply == "I can't use files shared this way yet; please describe what you need in words."
    assert adapter_rig.harness.seen == []


async def test_shared_message_becomes_text(slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig) -> None:
    share = {"is_share": True, "author_name": "Bob", "text": "the build is red", "fallback": "[x] the build"}
    async with running(channel, adapter_rig):
        await slack.send_event(dm_event(slack, text="", attachments=[share]))
        await slack.wait_for(lambda: slack.texts(DM))
    assert adapter_rig.harness.seen == [("(shared message from Bob) the build is red", [])]
    # Bob's words, not the sender's: the turn carries that provenance (agent/provenance.py).
    assert [s.describe() for s in adapter_rig.harness.calls[-1].options.provenance] == [
        "a message by Bob (forwarded)"
    ]


async def test_lone_surrogate_is_replaced_and_answered(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        await slack.send_event(dm_event(slack, text="bad \ud800 char"))
        (reply,) = await slack.wait_for(lambda: slack.texts(DM))
    assert reply == "echo: bad \ufffd char"


# -- fatal vs transient ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "status", "error"),
    [("auth.test", 500, "internal_error"), ("auth.test", 200, "ratelimited"),
     ("apps.connections.open", 503, "service_unavailable")],
)  # fmt: skip
async def test_transient_errors_at_start_are_retried(
    method: str, status: int, error: str, slack: FakeSlack, channel: SlackChannel
) -> None:
    slack.fail(method, error, status=status, times=1)
    sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await slack.wait_for(lambda: channel.state is ChannelState.CONNECTED, 10)
        assert len(slack.calls_to(method)) >= 2
    finally:
        await sup.stop()


@pytest.mark.parametrize("error", ["invalid_auth", "account_inactive", "token_revoked"])
async def test_revoked_tokens_are_fatal(error: str, slack: FakeSlack, channel: SlackChannel) -> None:
    slack.fail("auth.test", error, times=None)
    sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await slack.wait_for(lambda: channel.state is ChannelState.FAILED, 10)
        assert error in (channel.reason or "") and slack.bot_token not in (channel.reason or "")
        assert len(slack.calls_to("auth.test")) == 1
    finally:
        await sup.stop()
    with pytest.raises(FatalChannelError):
        await asyncio.wait_for(run_once(channel, lambda _i: asyncio.sleep(0)), 5)


# -- table-driven malformed variants (channels/malformed.py) ---------------------------------------
EVENT = ("payload", "event")
EVENT_CASES = variants({
    (*EVENT, "user"): (("number", "object", "list", "huge id", "control chars"), False),
    (*EVENT, "channel"): (("number", "missing", "object", "huge id"), False),
    (*EVENT, "ts"): (("number", "missing", "null", "list"), False),
    (*EVENT, "text"): (("number", "object", "list"), True),
    (*EVENT, "thread_ts"): (("float", "object"), True),
    (*EVENT, "files"): (("string", "number", "nested nulls", "many files"), True),
    (*EVENT, "subtype"): (("number", "list"), True),
    (*EVENT, "type"): (("null", "number", "missing"), True),
    EVENT: (("missing", "null", "string", "list", "number"), False),
    ("payload",): (("missing", "null", "string", "number", "list"), False),
})  # fmt: skip
PRESS_CASES = variants({
    ("payload", "actions"): (("null", "string", "list", "object", "missing", "huge list"), True),
    ("payload", "user"): (("null", "number", "string", "nested nulls"), False),
    ("payload", "type"): (("null", "number", "string"), True),
    ("payload", "channel"): (("string", "list"), True),  # the container still names the channel
})  # fmt: skip


def events_envelope(slack: FakeSlack, event: dict[str, Any]) -> dict[str, Any]:
    n = slack.next_ts().replace(".", "")
    return {"envelope_id": f"env-t-{n}", "type": "events_api", "accepts_response_payload": False,
            "retry_attempt": 0, "retry_reason": "",
            "payload": {"token": "t", "team_id": slack.team_id, "api_app_id": "A_APP", "event": event,
                        "type": "event_callback", "event_id": f"EvT{n}", "event_time": 1,
                        "authorizations": [{"team_id": slack.team_id, "user_id": slack.bot_user_id,
                                            "is_bot": True}]}}  # fmt: skip


def press_envelope(slack: FakeSlack) -> dict[str, Any]:
    n = slack.next_ts().replace(".", "")
    return {"envelope_id": f"env-p-{n}", "type": "interactive", "accepts_response_payload": False,
            "payload": {"type": "block_actions", "user": {"id": ALICE, "username": "alice"},
                        "channel": {"id": DM}, "team": {"id": slack.team_id},
                        "container": {"type": "message", "message_ts": "1.0", "channel_id": DM},
                        "message": {"ts": "1.0", "text": SECRET},
                        "actions": [{"action_id": "chital:0", "value": "chital:approve:ZZZZ",
                                     "type": "button"}]}}  # fmt: skip


async def serves_after(slack: FakeSlack) -> None:
    await slack.inject_dm(DM, ALICE, "still there?")
    await slack.wait_for(lambda: says(slack, "echo: still there?"), 10)


@pytest.mark.parametrize("case", EVENT_CASES, ids=lambda c: c.id)
async def test_every_malformed_event_is_acked_counted_and_answered(
    case: Case, slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="channels")
    caplog.set_level(logging.INFO)
    good = events_envelope(slack, dm_event(slack, text=SECRET))
    bad = put(good, case.path, case.value)
    async with running(channel, adapter_rig):
        await slack.send_envelope(bad)
        await slack.wait_for(lambda: slack.is_acked(bad), 10)
        if case.told:
            await slack.wait_for(lambda: says(slack, "couldn't read that message"), 10)
        await serves_after(slack)
    assert malformed_total(adapter_rig, "slack") == 1
    assert adapter_rig.metric("chital_malformed_events_total", platform="slack", kind="message") == 1
    assert bool(says(slack, "couldn't read")) is case.told
    assert not leaked(caplog.records)


@pytest.mark.parametrize("case", PRESS_CASES, ids=lambda c: c.id)
async def test_every_malformed_press_is_acked_counted_and_refused(
    case: Case, slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bad = put(press_envelope(slack), case.path, case.value)
    async with running(channel, adapter_rig):
        await slack.send_envelope(bad)
        await slack.wait_for(lambda: slack.is_acked(bad), 10)
        if case.told:
            await slack.wait_for(lambda: slack.ephemerals, 10)
        await serves_after(slack)
    assert malformed_total(adapter_rig, "slack") == 1
    refusals = [e for e in slack.ephemerals if e["user"] == ALICE and e["channel"] == DM]
    assert bool(refusals) is case.told
    assert all("couldn't read that button" in e["text"] or "can't handle that" in e["text"] for e in refusals)
    assert not leaked(caplog.records)


async def test_the_issue_examples_a_numeric_user_and_a_null_payload(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    numeric = events_envelope(slack, dm_event(slack, user=12345))
    null_payload = {**events_envelope(slack, dm_event(slack)), "payload": None}
    async with running(channel, adapter_rig):
        for envelope in (numeric, null_payload):
            await slack.send_envelope(envelope)
        await slack.wait_for(lambda: slack.is_acked(numeric) and slack.is_acked(null_payload), 10)
        await serves_after(slack)
    assert adapter_rig.metric("chital_malformed_events_total", platform="slack", kind="message") == 2


async def test_slash_commands_and_shortcuts_are_acked_with_a_refusal(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    # No trigger_id: a slash command that cannot be journaled (channels/slack/commands.py).
    command = {"envelope_id": "env-cmd", "type": "slash_commands", "accepts_response_payload": True,
               "payload": {"command": "/new", "text": SECRET, "user_id": ALICE, "channel_id": DM,
                           "team_id": slack.team_id}}  # fmt: skip
    broken = {**command, "envelope_id": "env-cmd-null", "payload": None}
    shortcut = {"envelope_id": "env-sc", "type": "interactive", "accepts_response_payload": False,
                "payload": {"type": "shortcut", "callback_id": "x", "user": {"id": ALICE},
                            "team": {"id": slack.team_id}}}  # fmt: skip
    async with running(channel, adapter_rig):
        for envelope in (command, broken, shortcut):
            await slack.send_envelope(envelope)
        await slack.wait_for(lambda: all(slack.is_acked(e) for e in (command, broken, shortcut)), 10)
        await serves_after(slack)
    assert "couldn't read that command" in slack.ack_payloads["env-cmd"]["text"]
    assert adapter_rig.metric("chital_malformed_events_total", platform="slack", kind="command") == 2
    assert adapter_rig.metric("chital_malformed_events_total", platform="slack", kind="interaction") == 1


async def test_unreadable_notes_are_rate_limited_per_sender(
    slack: FakeSlack, channel: SlackChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        bad = [await slack.send_event(dm_event(slack, text={"n": i})) for i in range(6)]
        await slack.wait_for(lambda: all(slack.is_acked(e) for e in bad), 10)
        await serves_after(slack)
    assert adapter_rig.metric("chital_malformed_events_total", platform="slack", kind="message") == 6
    assert len(says(slack, "couldn't read")) == 3, "three notes a minute, then quiet"
