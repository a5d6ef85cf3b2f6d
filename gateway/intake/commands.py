"""Chat commands: parsing, the help text, and what each one does.

A command is journaled like any message and may run more than once: after a crash (resume at the
next start) or when its reply could not be delivered (a retry). So every command with an effect is
keyed by its journal key: ``/new`` records its thread id before the thread exists, the others record
their reply before it is sent, and a re-run repeats that reply instead of the effect.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.untrusted import TEXT_CHARS, code_span
from gateway.config.durations import about, in_words
from gateway.intake import access
from gateway.store.access import PAIRING_ALPHABET, PAIRING_CODE_LEN, normalize_code
from gateway.store.journal import JournalEntry
from gateway.turns import stopping

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.agent_api import AgentHarness, MemoryAccess
    from gateway.daemon.gateway import Gateway

log = logging.getLogger(__name__)

COMMANDS: dict[str, str] = {
    "new": "start a fresh conversation (the agent forgets this chat's history)",
    "stop": "cancel the answer being worked on",
    "status": "show this conversation's thread, model and queue",
    "memory": "show what I remember about you (in a direct message)",
    "forget": "erase everything I remember about you",
    "schedules": "list this conversation's schedules (/schedules cancel ID cancels one; "
    "/schedules confirm ID lets one that waits for your confirmation run)",
    "unschedule": "cancel a schedule: /unschedule ID (its creator or an admin)",
    "model": "list the models (alone) or switch this conversation's: /model NAME",
    "usage": "show the tokens you used (today, 7 and 30 days) and your daily budget",
    "skills": "list the skills; /<skill> text uses one for that message",
    "help": "list the commands",
}
ADMIN_COMMANDS: dict[str, str] = {
    "approve": "approve a pairing code (alone: list the pending requests)",
    "deny": "refuse a pairing code",
    "revoke": "take back a user's access granted by code (alone: list them)",
}
RECORDED = frozenset({"stop", "forget", "approve", "deny", "revoke"})
"""Commands whose reply is recorded before it is sent (``/new`` records its thread id instead)."""
RECORDED |= {"schedules", "unschedule"}  # gateway/schedules/runner.py: a re-run repeats "cancelled"
# a re-run repeats the reply instead of switching again (gateway/intake/commands_agent.py)
RECORDED |= {"model"}
LIST_MAX = 30
FACT_CHARS = 300
"""Characters of one remembered fact ``/memory`` shows (the agent's extraction keeps facts short)."""
_CODE = re.compile(f"[{PAIRING_ALPHABET}]{{{PAIRING_CODE_LEN}}}")

_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]{0,31})(?:@\S+)?(?:\s+(.*))?$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: str
    known: bool


def parse_command(text: str) -> Command | None:
    """``/name args`` → Command; anything else (including paths like ``/usr/bin``) → None."""
    m = _COMMAND.match(text.strip())
    if not m:
        return None
    name = m.group(1).lower()
    known = name in COMMANDS or name in ADMIN_COMMANDS
    return Command(name=name, args=(m.group(2) or "").strip(), known=known)


def help_text(admin: bool = False) -> str:
    lines = ["Commands:"]
    lines += [f"/{name} — {what}" for name, what in COMMANDS.items()]
    if admin:
        lines.append("Admin:")
        lines += [f"/{name} — {what}" for name, what in ADMIN_COMMANDS.items()]
    lines.append("Anything else you write goes to the agent.")
    return "\n".join(lines)


def unknown_text(name: str) -> str:
    return f"Unknown command /{name}. " + help_text()


def new_text(thread_id: str) -> str:
    return f"🆕 Started a fresh conversation (thread {thread_id[:8]})."


# -- running them ------------------------------------------------------------------------------------
async def execute(gw: Gateway, entry: JournalEntry, cmd: Command) -> str:
    """Run ``cmd`` for ``entry`` and return the reply, once per journal key (see the module doc)."""
    recorded = cmd.name in RECORDED
    if recorded:
        done = await gw.store.command_result(entry.key)
        if done is not None:
            return done
    text = await _run(gw, entry, cmd)
    if recorded:
        text, _ = await gw.store.command_result_put(entry.key, text)
    return text


async def _run(gw: Gateway, entry: JournalEntry, cmd: Command) -> str:
    conv, inbound = entry.conversation, entry.inbound
    if cmd.name in ADMIN_COMMANDS:
        if not access.is_admin(gw.config.access_for(inbound.platform), inbound):
            return f"Sorry, only an admin of this bot can use /{cmd.name}."
        if cmd.name == "revoke":
            return await _revoke(gw, entry, cmd.args)
        return await _decide(gw, entry, cmd.name, cmd.args)
    if cmd.name in ("schedules", "unschedule"):
        from gateway.schedules import runner as schedules

        return await schedules.command(gw, entry, cmd)
    if cmd.name == "help":
        return help_text(access.is_admin(gw.config.access_for(inbound.platform), inbound))
    if cmd.name == "stop":
        stopped = await stopping.stop(gw, entry)
        if stopped is not None:
            return stopped
        who = code_span(inbound.sender_name or inbound.sender_id)
        if await gw.approvals.cancel(conv, inbound.platform, f"stopped by {who}"):  # docs/approvals.md
            return "⏹ Cancelled the request waiting for approval; nothing was run."
        return "Nothing is running."
    if cmd.name == "new":
        return new_text(await gw.store.new_thread(conv, key=entry.key))
    if cmd.name == "status":
        return await _status(gw, conv, inbound)
    if cmd.name in ("model", "usage", "skills"):
        from gateway.intake import commands_agent

        if cmd.name == "model":
            return await commands_agent.model_command(gw, inbound, cmd.args)
        if cmd.name == "usage":
            return await commands_agent.usage_command(gw, inbound)
        return commands_agent.skills_command(gw)
    if cmd.name in ("memory", "forget"):
        return await _memory(gw, entry, cmd.name)
    return unknown_text(cmd.name)  # pragma: no cover - parse_command marks only the names above known


async def thread_line(harness: AgentHarness, thread_id: str | None) -> str:
    """``Thread: 1a2b3c4d — 12 messages — “title”`` (also the terminal chat's /status)."""
    count = await harness.message_count(thread_id) if thread_id else 0
    title = await harness.title(thread_id) if thread_id else None
    return f"Thread: {thread_id[:8] if thread_id else '(none yet)'} — {count} messages" + (
        f" — {code_span(title, TEXT_CHARS)}" if title else ""
    )


async def _status(gw: Gateway, conversation: str, inbound: Inbound) -> str:
    from gateway.intake.commands_agent import sandbox_line, status_lines

    thread_id = await gw.store.thread_get(conversation)
    running, queued = gw.turns.status(conversation)
    lines = [
        await thread_line(gw.harness, thread_id),
        *await status_lines(gw, inbound),  # model and profile (gateway/intake/commands_agent.py)
        sandbox_line(gw.harness),
        f"Now: {'answering a message' if running else 'idle'}; {queued} queued",
        f"All chats: {gw.turns.running_count} running (limit {gw.config.concurrency.max_turns})",
    ]
    return "\n".join(lines)


async def _memory(gw: Gateway, entry: JournalEntry, name: str) -> str:
    inbound = entry.inbound
    return await memory_reply(gw.harness.memory, inbound.user, name, direct=inbound.is_direct)


async def memory_reply(memory: MemoryAccess | None, user: str, name: str, *, direct: bool) -> str:
    """``/memory`` or ``/forget`` for ``user`` (also the terminal chat's)."""
    if memory is None:
        return "Long-term memory is off."
    if name == "forget":
        count = await memory.forget(user)
        return f"🧹 Done: I erased {count} thing(s) I remembered about you."
    if not direct:
        # One user's memory is never shown to others: a group would see the answer.
        return "I only show what I remember about you in a direct message. Send me /memory there."
    facts = await memory.list(user)
    if not facts:
        return "I don't remember anything about you yet."
    lines = [f"What I remember about you ({len(facts)}):"]
    lines += [f"- {code_span(fact.text, FACT_CHARS)}" for fact in facts]
    lines.append("Send /forget to erase all of it.")
    return "\n".join(lines)


# -- admin commands ----------------------------------------------------------------------------------
async def _decide(gw: Gateway, entry: JournalEntry, name: str, args: str) -> str:
    """``/approve CODE`` and ``/deny CODE``. Unknown codes count against the admin (a window of
    :data:`gateway.intake.limits.BAD_CODES`), codes of channels they do not administer look unknown."""
    inbound, store = entry.inbound, gw.store
    if not args:
        return await _pending_list(gw, entry) if name == "approve" else "Usage: /deny CODE"
    wait = gw.throttles.bad_codes.wait(inbound.user)
    if wait:
        return f"Too many unknown codes. Try again in {about(wait)}."
    code = normalize_code(args)
    request = await store.pairing_get(code) if _CODE.fullmatch(code) else None
    if request is None or not access.may_administer(gw.config, inbound, request.platform):
        user = await store.approved_by_code(code) if name == "approve" else None
        if user and access.may_administer(gw.config, inbound, user.partition(":")[0]):
            return f"✅ {code_span(user)} is approved (code {code})."
        gw.throttles.bad_codes.add(inbound.user)
        return (
            f"No pending pairing code {code_span(code, PAIRING_CODE_LEN + 8)}. "
            "Send /approve alone to list the pending requests."
        )
    if name == "deny":
        ttl = gw.config.access_for(request.platform).pairing_code_ttl
        await store.pairing_deny(code, ttl)
        log.info("pairing: %s denied %s (code %s)", inbound.user, request.user, code)
        await gw.tell(request.platform, request.chat_id, f"denied-{code}", access.denied_text())
        return f"🚫 Denied {request.chat_label()}. They get no new code for {in_words(ttl)}."
    if request.expired():
        return f"Code {code} has expired. Ask {request.chat_label()} to message me again for a new one."
    user = await store.pairing_approve(code)
    if user is None:  # lapsed between the two reads
        return f"Code {code} has expired. Ask {request.chat_label()} to message me again for a new one."
    log.info("pairing: %s approved %s (code %s)", inbound.user, user, code)
    await gw.tell(request.platform, request.chat_id, f"approved-{code}", access.approved_text())
    return f"✅ Approved {request.chat_label()}. They can talk to me now."


async def _revoke(gw: Gateway, entry: JournalEntry, args: str) -> str:
    inbound = entry.inbound
    if not args:
        return await _approved_list(gw, entry)
    user = access.qualify_user(args, inbound.platform)
    if user is None:
        return "Usage: /revoke USER — the user's id, e.g. /revoke telegram:12345"
    if not access.may_administer(gw.config, inbound, user.partition(":")[0]):
        return (
            f"You are not an admin of {code_span(user.partition(':')[0])}; use `chital pairing revoke USER`."
        )
    removed = await gw.store.revoke(user)
    if removed:
        log.info("pairing: %s revoked %s", inbound.user, user)
    text = (
        f"🚫 Revoked {code_span(user)}: they get a pairing code again if they write."
        if removed
        else (f"{code_span(user)} was not approved by code.")
    )
    if access.config_allowed(gw.config, user):
        text += " They are also let in by config.yaml (access.allow_users / admins): remove them there."
    return text


async def _pending_list(gw: Gateway, entry: JournalEntry) -> str:
    if not entry.inbound.is_direct:
        return "I list pending requests only in a direct message."
    now = time.time()
    mine = [
        r
        for r in await gw.store.pairing_list()
        if not r.expired(now) and access.may_administer(gw.config, entry.inbound, r.platform)
    ]
    if not mine:
        return "No pending pairing requests."
    lines = [f"Pending requests ({len(mine)}):"]
    for r in mine[:LIST_MAX]:
        state = "denied" if r.denied else f"expires in {about(r.expires - now)}"
        lines.append(f"{r.code} — {r.chat_label()} — {state}")
    lines.append("Approve one with /approve CODE, refuse it with /deny CODE.")
    return "\n".join(lines)


async def _approved_list(gw: Gateway, entry: JournalEntry) -> str:
    if not entry.inbound.is_direct:
        return "I list approved users only in a direct message."
    users = [
        u
        for u, _ in await gw.store.approved_list()
        if access.may_administer(gw.config, entry.inbound, u.partition(":")[0])
    ]
    if not users:
        return "Nobody is approved by code."
    more = f" (first {LIST_MAX})" if len(users) > LIST_MAX else ""
    shown = "\n".join(code_span(u) for u in users[:LIST_MAX])
    return f"Approved by code{more}:\n{shown}\nRevoke with /revoke USER."
