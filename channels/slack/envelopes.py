"""Slack Socket Mode envelopes: each one acknowledged, unless our own listener asked for redelivery.

Why this module takes over from the SDK's request routing. slack_sdk builds a request only from an
envelope whose payload is an object (``"payload": null`` fails before any listener), and bolt
answers 404 or 500 to what it cannot route or parse (``"user": 12345`` makes its context builder
raise; a slash command or a shortcut has no listener). The Socket Mode adapter sends no ack for
either, so Slack redelivers the envelope again and again and, after enough failures, turns the
app's event delivery off. Here every frame goes through :func:`handle`, registered as the SDK's one
message listener (its request listeners are emptied):

* an envelope that is well formed goes to bolt (``AsyncApp.async_dispatch``); bolt's 200 is
  acknowledged as bolt's own adapter would (``send_async_response``). Our listeners journal before
  they return, so a well-formed message is still acknowledged only after the sink journaled it;
* when one of our listeners refused the envelope on purpose (the sink raised: the gateway is
  shutting down, the store is down) nothing is sent, and Slack redelivers it later: the one case
  in which an envelope stays unacknowledged;
* a slash command (``slash_commands`` with an object payload) never goes to bolt: the channel
  journals it as the typed command it stands for (channels/slack/commands.py) and the ack, sent
  within Slack's 3 s once it is journaled, shows the invocation in the channel;
* everything else (an envelope without a payload or event, an event or press bolt could not parse,
  an interaction type the app never offered, a slash command that cannot be read) is malformed
  input: counted by kind, logged without its text, skipped through the gateway (a journaled note
  to a known sender) or refused to the presser (an ephemeral note, a slash command's ack text),
  and acknowledged.

Which listener ran is told through a context variable that bolt's dispatch carries along (it runs
our listeners to completion before it returns, ``process_before_response=True``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slack_bolt.adapter.socket_mode.async_internals import send_async_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse

from channels import malformed
from channels.base import ChannelError

from .inbound import recover_ids

if TYPE_CHECKING:
    from .channel import SlackChannel

log = logging.getLogger(__name__)

ACTION_ID = "chital:"
"""Prefix of our buttons' action ids (bolt routes presses by it)."""
ROUTED = ("events_api", "interactive", "slash_commands")
"""Envelope types that carry a request; ``hello`` and ``disconnect`` are the SDK's own business."""


@dataclasses.dataclass
class Dispatch:
    """What our listeners did with one envelope (see the module docstring)."""

    reached: bool = False
    refused: bool = False


CURRENT: contextvars.ContextVar[Dispatch | None] = contextvars.ContextVar("slack_dispatch", default=None)


def reached() -> Dispatch:
    """Mark the envelope being dispatched as having reached one of our listeners."""
    state = CURRENT.get()
    if state is None:  # a listener run outside :func:`handle` (cannot happen): track nothing
        state = Dispatch()
    state.reached = True
    return state


def _kind(etype: Any, payload: Any) -> str:
    if etype == "events_api":
        return malformed.MESSAGE
    if etype == "slash_commands":
        return malformed.COMMAND
    if etype == "interactive":
        ptype = payload.get("type") if isinstance(payload, dict) else None
        return malformed.ACTION if ptype in ("block_actions", None) else malformed.INTERACTION
    return malformed.ENVELOPE


def _routable(etype: str, payload: Any) -> bool:
    """The envelope is one bolt has a listener for, with the fields bolt itself reads (to build
    its context, before any listener) of the right type. Anything else never reaches bolt: it
    would answer 404 or 500 and log the request's shape."""
    if not isinstance(payload, dict) or not _optional_ids(payload, "team_id", "enterprise_id", "user_id"):
        return False
    if etype == "events_api":
        event = payload.get("event")
        return (
            isinstance(event, dict)
            and isinstance(event.get("type"), str)
            and _optional_ids(event, "user", "channel", "team", "subtype", "bot_id", "thread_ts", "ts")
        )
    if etype == "interactive" and payload.get("type") == "block_actions":
        user, actions = payload.get("user"), payload.get("actions")
        return (
            isinstance(user, dict)
            and malformed.is_id(user.get("id"))
            and _optional_dicts(payload, "channel", "container", "message", "team")
            and isinstance(actions, list)
            and len(actions) == 1  # one press per payload: our buttons send nothing else
            and isinstance(actions[0], dict)
            and isinstance(actions[0].get("action_id"), str)
            and actions[0]["action_id"].startswith(ACTION_ID)
        )
    return False  # shortcuts, modals: the app offers none (slash commands: handle())


def _optional_ids(body: dict[str, Any], *keys: str) -> bool:
    return all(body.get(k) is None or malformed.is_id(body[k]) for k in keys)


def _optional_dicts(body: dict[str, Any], *keys: str) -> bool:
    return all(body.get(k) is None or isinstance(body[k], dict) for k in keys)


async def handle(
    channel: SlackChannel, app: AsyncApp, client: AsyncBaseSocketModeClient, message: dict[str, Any], raw: str
) -> None:
    """One Socket Mode frame (the SDK's message listener). Never raises for the frame's content;
    a :class:`ChannelError` from the sink propagates (the SDK logs it) and leaves it unacked."""
    etype = message.get("type")
    if etype in ("hello", "disconnect"):
        return
    envelope_id = message.get("envelope_id")
    payload = message.get("payload")
    kind = _kind(etype, payload)
    if not malformed.is_id(envelope_id):
        if etype in ROUTED or envelope_id is not None:
            channel.count_malformed(malformed.ENVELOPE)
            log.warning("slack: a %s frame without a usable envelope id; skipped", _label(etype))
            if isinstance(envelope_id, str | int) and not isinstance(envelope_id, bool):
                await _ack(client, envelope_id)  # type: ignore[arg-type]  # echoed as it came
        return  # otherwise a control frame newer than this code: not ours to judge
    if etype == "slash_commands" and isinstance(payload, dict):
        await _ack(client, envelope_id, await channel.on_slash(payload))  # channels/slack/commands.py
        return
    if etype not in ROUTED or not _routable(str(etype), payload) or not isinstance(payload, dict):
        await _skip(channel, client, envelope_id, kind if etype in ROUTED else malformed.ENVELOPE, payload)
        return
    req = SocketModeRequest(
        type=str(etype),
        envelope_id=envelope_id,
        payload=payload,
        accepts_response_payload=message.get("accepts_response_payload") is True,
        retry_attempt=_int(message.get("retry_attempt")),
        retry_reason=message.get("retry_reason") if isinstance(message.get("retry_reason"), str) else None,
    )
    state = Dispatch()
    token = CURRENT.set(state)
    start = time.time()
    try:
        bolt_req = AsyncBoltRequest(mode="socket_mode", body=payload, headers=_headers(req))
        resp = await app.async_dispatch(bolt_req)
    except ChannelError:
        raise
    except Exception as exc:  # bolt could not even build its request (a mistyped user id ...)
        if state.refused:
            raise
        log.info("slack: bolt could not read envelope %s: %s", envelope_id, type(exc).__name__)
        resp = None
    finally:
        CURRENT.reset(token)
    if resp is not None and resp.status == 200:
        await send_async_response(client, req, resp, start)
    elif state.refused:
        return  # our listener asked for redelivery: the sink failed
    elif state.reached:
        await _ack(client, envelope_id)  # handled; bolt's status says nothing more
    else:
        await _skip(channel, client, envelope_id, kind, payload)


async def _skip(
    channel: SlackChannel, client: AsyncBaseSocketModeClient, envelope_id: str, kind: str, payload: Any
) -> None:
    """Count, tell whom we can, acknowledge."""
    body = payload if isinstance(payload, dict) else {}
    event_id = body.get("event_id")
    ref = (
        f"event {event_id} (envelope {envelope_id})"
        if malformed.is_id(event_id)
        else f"envelope {envelope_id}"
    )
    answer: dict[str, Any] | None = None
    if kind == malformed.MESSAGE or kind == malformed.ENVELOPE:
        event = body.get("event")
        await channel.skip_envelope(
            kind,
            lambda: recover_ids(ref, event, channel.bot_user_id),
            ValueError("an envelope without a readable event"),
        )
    elif kind == malformed.COMMAND:
        channel.count_malformed(kind)
        log.warning("slack: slash command envelope %s without a payload; refused", envelope_id)
        answer = {"text": malformed.COMMAND_UNKNOWN, "response_type": "ephemeral"}
    else:
        channel.count_malformed(kind)
        log.warning("slack: %s envelope %s could not be handled; refused", kind, envelope_id)
        text = malformed.ACTION_UNREADABLE if kind == malformed.ACTION else malformed.INTERACTION_UNKNOWN
        await refuse(channel, body, text)
    await _ack(client, envelope_id, answer)


async def refuse(channel: SlackChannel, body: dict[str, Any], text: str) -> None:
    """Tell the presser of an interaction we cannot handle, when its payload names them and the
    channel: an ephemeral note, :data:`channels.malformed.REFUSALS_PER_MINUTE` per sender."""
    user, where = body.get("user"), body.get("channel")
    user_id = user.get("id") if isinstance(user, dict) else body.get("user_id")
    channel_id = where.get("id") if isinstance(where, dict) else body.get("channel_id")
    container = body.get("container")
    if not malformed.is_id(channel_id) and isinstance(container, dict):
        channel_id = container.get("channel_id")
    if not (malformed.is_id(user_id) and malformed.is_id(channel_id)):
        return
    if channel.refusals.allow(str(user_id)):
        message = body.get("message")
        thread = message.get("thread_ts") if isinstance(message, dict) else None
        thread_ts = thread if malformed.is_id(thread) else None
        await channel.ephemeral(str(channel_id), str(user_id), text, thread_ts)


async def _ack(
    client: AsyncBaseSocketModeClient, envelope_id: str, payload: dict[str, Any] | None = None
) -> None:
    await client.send_socket_mode_response(SocketModeResponse(envelope_id=envelope_id, payload=payload))


def _headers(req: SocketModeRequest) -> dict[str, str | Sequence[str]] | None:
    """Bolt's retry headers, as its own Socket Mode adapter builds them."""
    headers: dict[str, str | Sequence[str]] = {}
    if req.retry_attempt is not None:
        headers["x-slack-retry-num"] = str(req.retry_attempt)
    if req.retry_reason is not None:
        headers["x-slack-retry-reason"] = req.retry_reason
    return headers or None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _label(etype: Any) -> str:
    return etype if isinstance(etype, str) and etype.isidentifier() and len(etype) <= 40 else "?"
