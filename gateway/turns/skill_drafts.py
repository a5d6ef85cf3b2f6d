"""Telling the admins that a skill the agent drafted waits for them (docs/skills.md, "Drafts").

``draft_skill`` (agent/skill_tools.py) writes a draft no one can load until an admin approves it;
without a word to the admins it would wait until one happened to look. When a turn drafts one
(:class:`~agent.events.SkillDrafted`), :func:`notify` posts a notice with Approve / Reject buttons,
as for a tool's approval:

- **the drafter is an admin** (of the platform they asked on): in the conversation, under the
  turn's reply: they are there, reading;
- **otherwise**: to each admin of every connected platform where a chat with them is known (their
  DM, remembered from their last DM to the bot, or their user id where that is the DM: Telegram,
  Slack), and to the configured ``access.admin_chats``: the same chats pairing requests go to
  (gateway/intake/access.py ``admin_chats``). Never into the drafter's own conversation: the
  notice is not theirs to answer.

The notice names the draft, who drafted it (the agent, for whom: the requester's id and display
name), its scripts (a draft is its SKILL.md alone: none, said so), its fingerprint, and the start of
its text in one fenced block (the model's words: secrets masked before the cut, invisible and bidi
characters removed, fences broken). The Approve button carries the fingerprint of the text on disk
when the notice was made: an approval after the text changed is refused (agent/skill_install.py).
Presses are handled by gateway/commands/skills.py ``on_action`` (only an admin of the platform
pressed on counts). The notice is best effort: a platform that refuses it is logged, the draft
still waits and ``/skills`` shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from agent.skill_install import draft_fingerprint, pending_drafts
from agent.skills import SKILL_FILE
from agent.untrusted import code_span, visible
from channels.base import Button, ReplyTarget
from gateway.intake.access import admin_chats, is_admin

if TYPE_CHECKING:
    from channels.base import Channel, Inbound
    from gateway.config.schema import Config
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

PREFIX = "skl"
"""Button values are ``skl:ok:NAME:FINGERPRINT`` / ``skl:no:NAME`` (Telegram allows 64 bytes: a
name too long for that gets the text answer only)."""
EXCERPT_CHARS = 900
"""Characters of the draft's SKILL.md the notice shows (one message with buttons: it must fit the
smallest platform limit, Discord's 2,000, whole)."""


def draft_buttons(name: str, fingerprint: str) -> list[Button] | None:
    """Approve (carrying ``fingerprint``) and Reject; None when they would not fit a button's value."""
    buttons = [
        Button("✅ Approve", f"{PREFIX}:ok:{name}:{fingerprint}", "primary"),
        Button("🗑 Reject", f"{PREFIX}:no:{name}", "danger"),
    ]
    return None if any(len(b.value.encode()) > 64 for b in buttons) else buttons


def notice_text(name: str, fingerprint: str, requester: str, text: str, redact: Callable[[str], str]) -> str:
    """The notice (Markdown): what waits, from whom, its scripts, the start of its text."""
    redacted = redact(text)
    cut = len(redacted) > EXCERPT_CHARS
    excerpt = visible(redacted[:EXCERPT_CHARS], lines=True).replace("```", "ˋˋˋ")
    more = f"\n(cut here: read all of it with /skills show {name})" if cut else ""
    return (
        f"📝 **A drafted skill waits for an admin**: {code_span(name, 64)}\n"
        f"Drafted by the agent, asked by {code_span(requester, 120)}.\n"
        "Scripts: none (a draft is its SKILL.md alone; nothing runs when it is approved).\n"
        f"```\n{excerpt}\n```{more}\n"
        f"Approve makes it usable by everyone. Only an admin can answer; or reply "
        f"`/skills approve {name} {fingerprint}` or `/skills reject {name}`."
    )


def _read(config: Config, name: str) -> tuple[str, str] | None:
    """(fingerprint, SKILL.md text) of the pending draft ``name``, read together."""
    settings = config.agent.skills
    fingerprint = draft_fingerprint(settings, name)
    draft = pending_drafts(settings).get(name)
    if fingerprint is None or draft is None:
        return None
    with (draft.dir / SKILL_FILE).open("rb") as fh:
        return fingerprint, fh.read(EXCERPT_CHARS * 4 + 1).decode("utf-8", "replace")


async def targets(
    config: Config, store: Store, channels: Mapping[str, Channel], inbound: Inbound
) -> list[ReplyTarget]:
    """Where the notice goes (see the module docstring)."""
    if is_admin(config.access_for(inbound.platform), inbound):
        return [inbound.target]
    out: list[ReplyTarget] = []
    for platform, channel in channels.items():
        if not channel.capabilities.buttons:
            continue
        for chat in await admin_chats(config.access_for(platform), platform, store):
            if platform == inbound.platform and chat == inbound.chat_id:
                continue  # the drafter's own chat: not theirs to answer
            out.append(ReplyTarget(platform, chat))
    return out


async def notify(
    config: Config,
    store: Store,
    channels: Mapping[str, Channel],
    inbound: Inbound,
    name: str,
    redact: Callable[[str], str],
) -> int:
    """Post the notice for the draft ``name`` drafted in answer to ``inbound``; returns how many
    chats it reached. Once per chat and fingerprint (the idempotency key), whatever replays."""
    read = await asyncio.to_thread(_read, config, name)
    if read is None:  # approved or rejected already
        return 0
    fingerprint, text = read
    buttons = draft_buttons(name, fingerprint)
    label = " ".join(inbound.sender_name.split())[:60]
    requester = f"{label} ({inbound.user})" if label else inbound.user
    notice = notice_text(name, fingerprint, requester, text, redact)
    sent = 0
    where = await targets(config, store, channels, inbound)
    if not where:
        log.warning("skills: no admin can be told of the draft %r (set access.admins)", name)
    for target in where:
        channel = channels[target.platform]
        key = f"skill-draft:{name}:{fingerprint}:{target.chat_id}"
        part = channel.render(notice)[0]
        try:
            if buttons is not None:
                await channel.send_buttons(target, part, buttons, idempotency_key=key)
            else:
                await channel.send(target, part, idempotency_key=key)
        except Exception as exc:  # one admin's platform refusing costs only that notice
            log.warning(
                "skills: could not tell %s:%s of the draft %r: %s", target.platform, target.chat_id, name, exc
            )
            continue
        sent += 1
    log.info("skills: the draft %r was announced in %d chat(s)", name, sent)
    return sent
