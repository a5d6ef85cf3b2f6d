"""Who may reach the agent, and whether a group message is for the bot at all. Deny by default."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from channels.base import Inbound

from .config import AccessPolicy
from .store import Store


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


def _matches(ids: list[str], platform: str, raw_id: str) -> bool:
    return raw_id in ids or f"{platform}:{raw_id}" in ids or "*" in ids or f"{platform}:*" in ids


def is_admin(policy: AccessPolicy, inbound: Inbound) -> bool:
    return _matches(policy.admins, inbound.platform, inbound.sender_id)


async def decide(inbound: Inbound, policy: AccessPolicy, store: Store, engaged: bool) -> Decision:
    """Decide what to do with ``inbound``.

    ``engaged`` says the conversation is a thread the bot already takes part in (e.g. a Slack thread
    it was mentioned in), where later messages need no new mention.
    """
    if not inbound.is_direct:
        if policy.group_policy == "off":
            return Decision(Verdict.IGNORE, "groups are off")
        free = policy.group_policy == "free" or _matches(
            policy.free_response_chats, inbound.platform, inbound.chat_id
        )
        if not (inbound.addressed or free or engaged):
            return Decision(Verdict.IGNORE, "not addressed")

    if _matches(policy.allow_users, inbound.platform, inbound.sender_id) or is_admin(policy, inbound):
        return Decision(Verdict.ALLOW)
    if not inbound.is_direct and _matches(policy.allow_chats, inbound.platform, inbound.chat_id):
        return Decision(Verdict.ALLOW)
    if await store.is_approved(inbound.user):
        return Decision(Verdict.ALLOW)
    if inbound.is_direct:
        return Decision(Verdict.PAIR if policy.pairing else Verdict.DENY, "unknown user")
    if not inbound.addressed:
        # Free-response chatter from a stranger: stay silent rather than refuse every line.
        return Decision(Verdict.IGNORE, "stranger in free-response chat")
    return Decision(Verdict.DENY, "unknown user in group")
