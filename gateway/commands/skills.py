"""``/skills``: the skills with their source, state and installer; and for an admin, installing one
from an archive sent with the command, removing one, approving or rejecting a draft.

``/skills install`` goes with a file: a document whose caption is ``/skills install``, or (on
Telegram, whose reply events carry the replied-to file) a reply to the message that carries it. The archive
is downloaded (capped at the archive limit before a byte is fetched when the platform says the
size), checked entirely in memory and only then written (agent/skill_install.py, the same code as
``chital skills install``). The reply lists the scripts in it for the admin to review.

Everything shown comes from someone else (a description, a file name, an installer's display
name): each goes out as one bounded code span, so no link, mention or bidi trick reaches the chat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.settings import SkillsSettings
from agent.skill_archive import MAX_ARCHIVE_BYTES
from agent.skill_install import (
    Listed,
    approve_draft,
    draft_fingerprint,
    install_archive,
    list_skills,
    pending_drafts,
    reject_draft,
    remove_skill,
)
from agent.skills import SKILL_FILE, SkillError, scan_skills
from agent.untrusted import TEXT_CHARS, code_span, visible
from channels.base import Action, ActionAnswer, Channel, ChannelError, Inbound, ReplyTarget, replied_file
from gateway.intake import access, profiles
from gateway.turns.skill_drafts import PREFIX as PREFIX  # the daemon routes presses by it
from gateway.turns.skill_drafts import draft_buttons

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.config.schema import Config
    from gateway.store.entries import JournalEntry

log = logging.getLogger(__name__)

DESCRIPTION_MAX = 160
"""Characters of a skill's description ``/skills`` shows (the agent sees all of it)."""
SCRIPTS_SHOWN = 25
DOWNLOAD_SECONDS = 120.0
ADMIN_ACTIONS = ("install", "remove", "show", "approve", "reject")
REPLY_PLATFORMS = frozenset({"telegram"})
"""Where ``/skills install`` may be a reply to the archive's message: the platform's event carries
the replied-to file (channels/messages.py ``REPLIED_FILE``). Slack's and Lark's reply events carry
only the parent's id (its files need another API call, with its own scopes), and Discord's
``referenced_message`` is not read for files yet: there, the archive goes with the command."""
REPLY_PLATFORMS_NOTE = " (here, as the caption: a reply does not bring the file along on this platform)"
ALREADY = "The draft"
"""How a press on a decided draft's buttons is answered (then its buttons come off)."""
SHOW_CHARS = 12_000
"""Characters of a skill's SKILL.md ``/skills show`` posts (the delivery splits long replies)."""


def listing(ctx: CommandContext, is_command: Callable[[str], bool]) -> str:
    """Every skill, with the command that asks for it, its source and state, and who installed it;
    a skill named like a command (``is_command``) is not reachable as ``/name``."""
    config = ctx.config
    if not config.agent.tools:
        return "Skills are off (the agent runs without tools)."
    found = list_skills(config.agent.skills)
    shown = [s for s in found if s.state not in ("replaced", "disabled")]
    if not shown:
        return "No skills are installed."
    lines = ["Skills — send /name and your request to use one for that message:"]
    for skill in shown:
        lines.append(_line(skill, is_command))
    lines.append("I also pick a skill myself when a request matches one.")
    return "\n".join(lines)


def _line(skill: Listed, is_command: Callable[[str], bool]) -> str:
    # The name is checked ([a-z0-9-], agent/skills.py); the rest is anyone's text.
    about = code_span(skill.description, DESCRIPTION_MAX, empty="(no description)")
    where = f"{skill.source}, {skill.state}"
    if skill.installed_by:
        where += f", installed by {code_span(skill.installed_by, TEXT_CHARS)}"
    command = profiles.command_name(skill.name)
    if skill.state == "awaiting approval":
        return (
            f"{skill.name} — {about} · {where} (an admin: /skills show {skill.name}, then approve or reject)"
        )
    if is_command(command):
        return f"{skill.name} — {about} (its name is a command: ask for it in words) · {where}"
    return f"/{command} — {about} · {where}"


def _installer(entry: JournalEntry) -> str:
    inbound = entry.inbound
    name = " ".join(inbound.sender_name.split())[:60]
    return f"{inbound.user} ({name})" if name else inbound.user


async def command(ctx: CommandContext, entry: JournalEntry, cmd: Command, commands: frozenset[str]) -> str:
    """``/skills [install | remove NAME | approve NAME | reject NAME]``; ``commands``: the chat
    commands' names and aliases (a skill may not be named like one)."""
    is_command = commands.__contains__
    words = cmd.args.split()
    action = words[0].lower() if words else ""
    if not action:
        return listing(ctx, is_command)
    if action not in ADMIN_ACTIONS:
        return f"Unknown /skills action {code_span(action, 40)}. Use /skills, or (an admin) " + ", ".join(
            f"/skills {a}" for a in ADMIN_ACTIONS
        )
    inbound = entry.inbound
    if not access.is_admin(ctx.config.access_for(inbound.platform), inbound):
        return f"Sorry, only an admin of this bot can /skills {action}."
    settings = ctx.config.agent.skills
    try:
        if action == "install":
            return await _install(ctx, entry, words[1:], commands)
        if action == "approve" and len(words) == 2:
            shown = code_span(words[1].lower(), 64)
            return f"Read it first: /skills show {shown}, then approve it with the fingerprint shown."
        if len(words) != (3 if action == "approve" else 2):
            return f"Name one skill: /skills {action} NAME" + (" FINGERPRINT" if action == "approve" else "")
        name = words[1].lower()
        if action == "remove":
            what = await asyncio.to_thread(remove_skill, settings, name)
            profiles.reload_skills(ctx.config)
            return f"🗑 Removed the {what} {code_span(name)}."
        if action == "show":
            text = await asyncio.to_thread(_show, settings, name)
            if (fingerprint := await asyncio.to_thread(draft_fingerprint, settings, name)) is not None:
                await _offer_buttons(ctx, entry, name, fingerprint)
            return text
        if action == "approve":
            skill = await asyncio.to_thread(approve_draft, settings, name, _installer(entry), words[2])
            profiles.reload_skills(ctx.config)
            return f"✅ Approved the skill {code_span(skill.name)}: everyone can use it now."
        if await asyncio.to_thread(reject_draft, settings, name):
            return f"🗑 Rejected the draft {code_span(name)}."
        return f"There is no draft named {code_span(name)}."
    except SkillError as exc:
        return f"⚠️ {code_span(str(exc), 300)}"


async def _offer_buttons(ctx: CommandContext, entry: JournalEntry, name: str, shown: str) -> None:
    """Approve / Reject under a draft, as for a tool's approval; the text answer works anyway. The
    Approve button carries the fingerprint of the text shown: it approves that text or nothing."""
    buttons = draft_buttons(name, shown)
    if ctx.buttons is None or buttons is None:
        return
    text = f"Approve the draft skill {code_span(name)}? Only an admin can answer."
    await ctx.buttons(entry.inbound, text, buttons, f"{entry.key}#skill-buttons")


async def on_action(config: Config, channels: Mapping[str, Channel], action: Action) -> ActionAnswer:
    """A press on a draft's Approve / Reject: an admin of that platform only; a press after the
    decision (or on a draft that is gone) changes nothing and says so. The decision replaces the
    buttons on the message (Slack tells a presser only of refusals)."""
    answer = await _decide(config, action)
    channel = channels.get(action.platform)
    # Buttons come off once the draft is decided: here, and on any other admin's copy of the
    # notice at its first press (the press is refused, the message then says why).
    settled = not answer.refused or answer.text.startswith(ALREADY)
    if settled and channel is not None and action.message_id:
        target = ReplyTarget(action.platform, action.chat_id, action.thread_id)
        try:
            await channel.close_buttons(target, action.message_id, channel.render(answer.text)[0])
        except Exception as exc:  # the decision holds whether or not the message shows it
            log.warning("skills: could not show the decision on the buttons: %s", exc)
    return answer


async def _decide(config: Config, action: Action) -> ActionAnswer:
    parts = action.value.split(":")
    if not ((len(parts) == 4 and parts[1] == "ok") or (len(parts) == 3 and parts[1] == "no")):
        return ActionAnswer("This button is not mine to answer.", refused=True)
    name, shown = parts[2], parts[3] if parts[1] == "ok" else None
    probe = Inbound(action.platform, action.chat_id, "", action.sender_id, "", False, False)
    if not access.is_admin(config.access_for(action.platform), probe):
        return ActionAnswer("⛔ Only an admin of this bot can approve or reject a skill.", refused=True)
    settings = config.agent.skills
    by = f"{action.user} ({' '.join(action.sender_name.split())[:60]})" if action.sender_name else action.user
    try:
        if parts[1] == "ok":
            await asyncio.to_thread(approve_draft, settings, name, by, shown)
            profiles.reload_skills(config)
            log.info("skills: %s approved the draft %r", action.user, name)
            return ActionAnswer(
                f"✅ Approved the skill {code_span(name)} by {code_span(by)}: everyone can use it now."
            )
        if await asyncio.to_thread(reject_draft, settings, name):
            log.info("skills: %s rejected the draft %r", action.user, name)
            return ActionAnswer(f"🗑 Rejected the draft {code_span(name)} by {code_span(by)}.")
    except SkillError as exc:
        if "not the text that was shown" in str(exc):
            return ActionAnswer(f"⚠️ {code_span(str(exc), 300)}", refused=True)
    return ActionAnswer(f"{ALREADY} {code_span(name)} was already approved or rejected.", refused=True)


def _show(settings: SkillsSettings, name: str) -> str:
    """The whole SKILL.md of a draft (or a custom skill), for the admin to read before approving:
    one fenced block, so nothing in it is a live link, mention or formatting."""
    drafts = pending_drafts(settings)
    skill = drafts.get(name) or scan_skills(Path(settings.custom_dir), "custom").get(name)
    if skill is None:
        return f"There is no draft or custom skill named {code_span(name)}."
    with (skill.dir / SKILL_FILE).open("rb") as fh:
        text = fh.read(SHOW_CHARS + 1).decode("utf-8", "replace")
    cut = len(text) > SHOW_CHARS
    text = visible(text[:SHOW_CHARS], lines=True).replace("```", "ˋˋˋ")
    head = f"{'Draft' if name in drafts else 'Custom skill'} {code_span(name)}"
    if skill.origin:
        head += f", {code_span(skill.origin, 300)}"
    tail = "\n(cut here: read the whole file on the server)" if cut else ""
    fingerprint = draft_fingerprint(settings, name) if name in drafts else None
    action = f"\n/skills approve {name} {fingerprint} or /skills reject {name}" if fingerprint else ""
    return f"{head}:\n```\n{text}\n```{tail}{action}"


async def _install(
    ctx: CommandContext, entry: JournalEntry, rest: list[str], commands: frozenset[str]
) -> str:
    inbound = entry.inbound
    replace = rest == ["replace"]
    if rest and not replace:
        return (
            "Send the archive (zip or tar.gz) with the caption /skills install (or /skills install replace)."
        )
    replied = replied_file(inbound) if not inbound.attachments else None
    if len(inbound.attachments) != 1 and replied is None:
        return (
            "Send the skill's archive (zip or tar.gz) as a file with the caption /skills install, "
            "or reply /skills install to the message that carries it"
            f"{REPLY_PLATFORMS_NOTE if inbound.platform not in REPLY_PLATFORMS else ''}; "
            f"this message has {len(inbound.attachments)} file(s)."
        )
    att, sent_by = replied if replied is not None else (inbound.attachments[0], "")
    if sent_by == "bot":  # what the agent (or another bot) made is drafted and reviewed, not installed
        return (
            "⚠️ That file was sent by a bot (perhaps me), so I will not install it: install an "
            "archive a person sent, or ask me to draft the skill (an admin then reviews it)."
        )
    if att.size is not None and att.size > MAX_ARCHIVE_BYTES:
        return f"⚠️ That file is {att.size:,} bytes; a skill archive may be at most {MAX_ARCHIVE_BYTES:,}."
    if ctx.download is None:
        return "I cannot fetch files here."
    try:
        async with asyncio.timeout(DOWNLOAD_SECONDS):
            data = await ctx.download(inbound, att, MAX_ARCHIVE_BYTES)
    except TimeoutError:
        return f"⚠️ I could not fetch the archive within {DOWNLOAD_SECONDS:.0f} s. Please send it again."
    except ChannelError as exc:
        return f"⚠️ I could not fetch the archive: {code_span(str(exc).replace(att.name, 'the file'), 200)}"
    done = await asyncio.to_thread(
        install_archive,
        data,
        ctx.config.agent.skills,
        installed_by=_installer(entry),
        origin=f"{inbound.platform} chat {inbound.chat_id}, file {att.name[:100]}"
        + (f" (replied to; sent by {sent_by})" if replied is not None else ""),
        reserved=commands,
        replace=replace,
    )
    profiles.reload_skills(ctx.config)
    log.info(
        "skills: %s installed %r from a chat file (%d scripts)", inbound.user, done.name, len(done.scripts)
    )
    verb = "Replaced" if done.replaced else "Installed"
    lines = [
        f"✅ {verb} the skill {code_span(done.name)} ({done.files} file(s), {done.unpacked_bytes:,} bytes): "
        f"{code_span(done.description, DESCRIPTION_MAX)}",
        f"Use it with /{profiles.command_name(done.name)} and your request.",
    ]
    if done.scripts:
        lines.append(f"Review these {len(done.scripts)} script(s) in it before relying on it:")
        lines += [f"- {code_span(s, TEXT_CHARS)}" for s in done.scripts[:SCRIPTS_SHOWN]]
        if len(done.scripts) > SCRIPTS_SHOWN:
            lines.append(f"… and {len(done.scripts) - SCRIPTS_SHOWN} more (see `chital skills list`).")
    else:
        lines.append("It has no scripts or executables.")
    return "\n".join(lines)
