"""Who may reach the agent, and whether a group message is for the bot at all. Deny by default.

Also the pairing path's facts: who administers which channel, where admins can be told of a request,
and what strangers and admins read (docs/access.md).
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass

from channels.base import Inbound
from gateway.config.durations import about, in_words
from gateway.config.schema import ChannelsConfig, Config
from gateway.config.sections import AccessPolicy
from gateway.store.access import PAIRING_ALPHABET, PAIRING_CODE_LEN, PairingRequest
from gateway.store.journal import Store

GUESS_SPACE = len(PAIRING_ALPHABET) ** PAIRING_CODE_LEN
"""32^8 = 2^40 ≈ 1.1e12 possible codes."""
DM_IS_USER_ID = frozenset({"telegram", "slack"})
"""Platforms where a user id addresses the user's DM with the bot: Telegram's private chat id is the
user id; Slack's chat.postMessage takes a user id and posts to the app's DM. On Discord and Lark the
DM is a chat of its own id, known once the user has written to the bot (or set in admin_chats)."""
STARTED_BY_BOT = "chital_started"
"""Marks, in an :class:`Inbound`'s ``extra``, a message the bot starts itself (an announcement to an
admin, a word to a stranger about their request): its reply replies to nothing."""
THREAD_ANCHOR = "chital_anchor"
"""With :data:`STARTED_BY_BOT`: a message to reply to all the same, on a platform that reaches a
thread only by replying into it (a schedule made in a Lark thread, gateway/schedules/runner.py)."""
PLATFORMS = frozenset(ChannelsConfig.model_fields)


class Verdict(enum.Enum):
    ALLOW = "allow"
    IGNORE = "ignore"
    """Not for the bot (group chatter without a mention): no reply, no journal."""
    PAIR = "pair"
    """A stranger in a DM: answer with a pairing code, never with the agent."""
    DENY = "deny"
    """A stranger addressing the bot in a group: a short refusal."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""


def matches(ids: list[str], platform: str, raw_id: str) -> bool:
    return raw_id in ids or f"{platform}:{raw_id}" in ids or "*" in ids or f"{platform}:*" in ids


HOOK_SENDER = "hook-"
"""How a hook's sender id starts (gateway/turns/hooks.py): no platform's user ids look like it."""


def admin_id(admins: list[str], platform: str, raw_id: str) -> bool:
    """Whether the user ``raw_id`` is one of ``admins`` (``access.admins``). A hook never is, not
    even by a wildcard: its words come from whoever holds its secret, not from a person the
    operator named (no budget exemption, no admin-only paths)."""
    return not raw_id.startswith(HOOK_SENDER) and matches(admins, platform, raw_id)


def is_admin(policy: AccessPolicy, inbound: Inbound) -> bool:
    return admin_id(policy.admins, inbound.platform, inbound.sender_id)


async def decide(inbound: Inbound, policy: AccessPolicy, store: Store, engaged: bool) -> Decision:
    """Decide what to do with ``inbound``.

    ``engaged`` says the conversation is a thread the bot already takes part in (e.g. a Slack thread
    it was mentioned in), where later messages need no new mention.
    """
    if not inbound.is_direct:
        if policy.group_policy == "off":
            return Decision(Verdict.IGNORE, "groups are off")
        free = policy.group_policy == "free" or matches(
            policy.free_response_chats, inbound.platform, inbound.chat_id
        )
        if not (inbound.addressed or free or engaged):
            return Decision(Verdict.IGNORE, "not addressed")

    if matches(policy.allow_users, inbound.platform, inbound.sender_id) or is_admin(policy, inbound):
        return Decision(Verdict.ALLOW)
    if not inbound.is_direct and matches(policy.allow_chats, inbound.platform, inbound.chat_id):
        return Decision(Verdict.ALLOW)
    if await store.is_approved(inbound.user):
        return Decision(Verdict.ALLOW)
    if inbound.is_direct:
        return Decision(Verdict.PAIR if policy.pairing else Verdict.DENY, "unknown user")
    if not inbound.addressed:
        # Free-response chatter from a stranger: stay silent rather than refuse every line.
        return Decision(Verdict.IGNORE, "stranger in free-response chat")
    return Decision(Verdict.DENY, "unknown user in group")


# -- admins ------------------------------------------------------------------------------------------
def may_administer(config: Config, actor: Inbound, platform: str) -> bool:
    """Whether the sender of ``actor`` may decide about users of ``platform``: they must be listed
    in that channel's ``admins`` (a bare id in a shared top-level list counts on every platform)."""
    if platform not in PLATFORMS:
        return False
    return admin_id(config.access_for(platform).admins, actor.platform, actor.sender_id)


def qualify_user(text: str, platform: str) -> str | None:
    """``12345``, ``telegram:12345``, ``<@U123>`` (a Slack or Discord mention) → ``platform:id``."""
    text = text.strip()
    mention = re.fullmatch(r"<@!?([A-Za-z0-9_]+)(?:\|[^>]*)?>", text)
    if mention:
        return f"{platform}:{mention.group(1)}"
    text = text.lstrip("@")
    if not re.fullmatch(r"(?:[a-z]+:)?[A-Za-z0-9_.-]{1,64}", text):
        return None
    return text if ":" in text else f"{platform}:{text}"


def config_allowed(config: Config, user: str) -> bool:
    """True when config.yaml itself lets ``user`` in (allow_users or admins): revoking a pairing
    approval cannot shut them out."""
    platform, _, raw = user.partition(":")
    if platform not in PLATFORMS:
        return False
    policy = config.access_for(platform)
    return matches(policy.allow_users, platform, raw) or matches(policy.admins, platform, raw)


async def admin_chats(policy: AccessPolicy, platform: str, store: Store) -> list[str]:
    """The chats of ``platform`` where its admins can be told about a pairing request: each admin's
    DM (remembered from their last DM to the bot, else the user id where that is the DM), then the
    configured ``admin_chats``. Wildcard admins name nobody in particular and are skipped."""
    out: list[str] = []
    for entry in policy.admins:
        prefix, _, raw = entry.rpartition(":")
        if raw == "*" or (prefix and prefix != platform):
            continue
        chat = await store.dm_chat_get(f"{platform}:{raw}")
        if chat is None and platform in DM_IS_USER_ID:
            chat = raw
        if chat and chat not in out:
            out.append(chat)
    for entry in policy.admin_chats:
        prefix, _, raw = entry.rpartition(":")
        if (not prefix or prefix == platform) and raw and raw not in out:
            out.append(raw)
    return out


# -- what people read ----------------------------------------------------------------------------
def pairing_text(request: PairingRequest, now: float | None = None, cli: str = "chital") -> str:
    """What the stranger reads: their code, how long it lasts, how an admin approves it. ``cli``
    (``Config.cli()``: ``chital -c /abs/config.yaml``) makes the command work from any directory;
    a bare ``chital pairing ...`` elsewhere would read another (or no) database."""
    now = time.time() if now is None else now
    if request.denied:
        return (
            "🚫 An admin declined your request for access. "
            f"You can ask again in about {about(request.expires - now)}."
        )
    code = request.code
    return (
        f"👋 I don't know you yet, so I can't help here. Your pairing code is {code} "
        f"(valid for {about(request.expires - now)}). Ask the bot's admin to approve it: "
        f"they can send me /approve {code} or run\n\n{cli} pairing approve {code}\n\n"
        "Once approved, send your message again."
    )


def announcement_text(request: PairingRequest, cli: str = "chital") -> str:
    """What the admins read when a stranger asks for access (``cli`` as in :func:`pairing_text`)."""
    return (
        f"🔑 {request.chat_label()} asks to use the bot. Pairing code {request.code}, valid for "
        f"{in_words(request.expires - request.created)}.\n"
        f"Approve: /approve {request.code}\nRefuse: /deny {request.code}\n"
        f"On the host: {cli} pairing approve {request.code}"
    )


def approved_text() -> str:
    return "✅ An admin approved you. Send me your message again; I'm listening."


def denied_text() -> str:
    return "🚫 An admin declined your request for access."
