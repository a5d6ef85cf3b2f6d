"""Chat commands: the registry's rows, running them once per journal key, and the general ones.

Every command is one row of :data:`REGISTRY` (the shape is gateway/commands/registry.py):
the parser, ``/help`` and the terminal chat's list are derived from the rows. The handlers are
here (``/new``, ``/stop``, ``/status``, ``/plan``, ``/memory``, ``/forget``, ``/help``), in
gateway/commands/agent.py (``/model``, ``/usage``, ``/skills``), in
gateway/commands/admin.py (``/approve``, ``/deny``, ``/revoke``), gateway/commands/background.py
(``/bg``, ``/tasks``) and, through the context, in gateway/commands/schedules.py (``/schedules``,
``/unschedule``) and, through the context, gateway/turns/stopping.py.

A command is journaled like any message and may run more than once: after a crash (resume at the
next start) or when its reply could not be delivered (a retry). So every command with an effect is
keyed by its journal key: ``/new`` records its thread id before the thread exists, the rows marked
``recorded`` record their reply before it is sent, and a re-run repeats that reply instead of the effect.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.untrusted import TEXT_CHARS, code_span
from gateway.commands import admin as commands_admin
from gateway.commands import agent as commands_agent
from gateway.commands import approvals as commands_approvals
from gateway.commands import background as commands_background
from gateway.commands import busy as commands_busy
from gateway.commands import mcp as commands_mcp
from gateway.commands import schedules as commands_schedules
from gateway.commands import skills as commands_skills
from gateway.commands import voice as commands_voice
from gateway.commands.registry import Command, CommandContext, CommandSpec, Registry, Who
from gateway.config.secrets import redactor_for
from gateway.delivery.plan import plan_text
from gateway.intake import access
from gateway.ops import tracing
from gateway.turns import stopping

if TYPE_CHECKING:
    from gateway.agent_api import AgentHarness, MemoryAccess
    from gateway.store.entries import JournalEntry

__all__ = ["REGISTRY", "Command", "CommandContext", "execute", "help_text", "parse_command", "unknown_text"]

log = logging.getLogger(__name__)

FACT_CHARS = 300
"""Characters of one remembered fact ``/memory`` shows (the agent's extraction keeps facts short)."""


# -- the general commands ------------------------------------------------------------------------
async def _new(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    return new_text(await ctx.store.new_thread(entry.conversation, key=entry.key))


async def _stop(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    return await _stop_answer(ctx, entry) + await commands_background.stop_hint(ctx, entry)


async def _stop_answer(ctx: CommandContext, entry: JournalEntry) -> str:
    stopped = await ctx.stop(entry)
    if stopped is not None and stopped != stopping.TOO_LATE:
        return stopped
    # No turn to stop, or one that ended just now: it may have ended paused for an approval (it
    # left the queue a moment after pausing), so waiting requests are cancelled either way.
    inbound = entry.inbound
    who = code_span(inbound.sender_name or inbound.sender_id)
    if await ctx.cancel_approvals(entry.conversation, inbound.platform, f"stopped by {who}"):
        return "⏹ Cancelled the request waiting for approval; nothing was run."  # docs/approvals.md
    return stopped or "Nothing is running."


async def _status(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    thread_id = await ctx.store.thread_get(entry.conversation)
    running, queued = ctx.turn_status(entry.conversation)
    lines = [
        await thread_line(ctx.harness, thread_id),
        *await commands_agent.status_lines(ctx, entry.inbound),  # model and profile
        commands_agent.sandbox_line(ctx.sandbox_state()),
        f"Now: {'answering a message' if running else 'idle'}; {queued} queued",
        f"All chats: {ctx.running_turns()} running (limit {ctx.config.concurrency.max_turns})",
        *tracing.status_lines(entry.conversation),  # the last turn's trace id, when tracing is on
    ]
    return "\n".join(lines)


async def _memory(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    inbound = entry.inbound
    if cmd.name == "forget" and ctx.background is not None:  # their tasks carry their words too
        await ctx.background.forget(inbound.user)
    return await memory_reply(ctx.harness.memory, inbound.user, cmd.name, direct=inbound.is_direct)


async def _plan(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """The conversation's plan as the checkpoint holds it (the agent's ``write_todos``): the same
    safe, bounded checklist the turn shows (gateway/delivery/plan.py), secrets masked before cut."""
    thread_id = await ctx.store.thread_get(entry.conversation)
    items = await ctx.harness.plan(thread_id) if thread_id else ()
    if not items:
        return "No plan in this conversation yet: the agent writes one when a task takes several steps."
    running, _ = ctx.turn_status(entry.conversation)
    text = plan_text(items, redactor_for(ctx.config))
    return text if running else text + "\n(as the last answer left it)"


async def _help(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    inbound = entry.inbound
    return help_text(access.is_admin(ctx.config.access_for(inbound.platform), inbound))


async def _model(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    return await commands_agent.model_command(ctx, entry.inbound, cmd.args)


async def _usage(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    return await commands_agent.usage_command(ctx, entry.inbound)


async def _skills(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    names = frozenset(name for row in REGISTRY.rows for name in (row.name, *row.aliases))
    return await commands_skills.command(ctx, entry, cmd, names)


# -- the registry --------------------------------------------------------------------------------
REGISTRY = Registry(
    [
        CommandSpec("new", "start a fresh conversation (the agent forgets this chat's history)", _new,
                    terminal=True),
        CommandSpec("stop", "cancel the answer being worked on", _stop, recorded=True),
        CommandSpec("queue", "answer this message after the current answer: /queue text",
                    commands_busy.one_off, args="TEXT"),
        CommandSpec("steer", "add this message to the current answer: /steer text",
                    commands_busy.one_off, args="TEXT"),
        CommandSpec("interrupt", "stop the current answer and answer this instead: /interrupt text",
                    commands_busy.one_off, args="TEXT"),
        CommandSpec("status", "show this conversation's thread, model and queue", _status, terminal=True),
        CommandSpec("voice", "spoken replies here: /voice on (answers to voice notes), all, or off",
                    commands_voice.voice, args="[on | all | off]"),
        CommandSpec("plan", "show the agent's plan (to-do list) for this conversation", _plan, terminal=True),
        CommandSpec("memory", "show what I remember about you (in a direct message)", _memory,
                    terminal=True),
        CommandSpec("forget", "erase everything I remember about you", _memory, recorded=True,
                    terminal=True),
        CommandSpec("bg", "run a task in the background while we go on talking: /bg TASK",
                    commands_background.bg_command, recorded=True, args="TASK"),
        CommandSpec("tasks", "list this conversation's background tasks and their progress "
                    "(/tasks stop ID stops one)", commands_background.tasks_command, recorded=True,
                    args="[stop ID]"),
        CommandSpec("schedules", "list this conversation's schedules (/schedules cancel ID cancels one; "
                    "/schedules confirm ID lets one that waits for your confirmation run)",
                    commands_schedules.command,
                    recorded=True, args="[cancel ID | confirm ID]"),
        CommandSpec("unschedule", "cancel a schedule: /unschedule ID (its creator or an admin)",
                    commands_schedules.command,
                    recorded=True, args="ID"),
        CommandSpec("model", "list the models (alone) or switch this conversation's: /model NAME", _model,
                    recorded=True, args="[NAME]"),
        CommandSpec("usage", "show the tokens you used (today, 7 and 30 days) and your daily budget", _usage),
        CommandSpec("skills", "list the skills; /<skill> text uses one for that message (an admin: "
                    "/skills install with an archive, /skills remove|approve|reject NAME)", _skills,
                    recorded=True, args="[install | remove NAME | approve NAME | reject NAME]"),
        CommandSpec("approvals", "standing permissions here (/approvals revoke ID ends one; admins: "
                    "/approvals log)", commands_approvals.approvals_command, recorded=True,
                    args="[revoke ID | log]"),
        CommandSpec("mcp", "list the MCP servers, their state and tools (admins: /mcp reload)",
                    commands_mcp.mcp_command, args="[reload]"),
        CommandSpec("help", "list the commands", _help, terminal=True),
        CommandSpec("approve", "approve a pairing code (alone: list the pending requests)",
                    commands_admin.decide, who=Who.ADMIN, recorded=True, args="[CODE]"),
        CommandSpec("deny", "refuse a pairing code", commands_admin.decide, who=Who.ADMIN, recorded=True,
                    args="CODE"),
        CommandSpec("revoke", "take back a user's access granted by code (alone: list them)",
                    commands_admin.revoke, who=Who.ADMIN, recorded=True, args="[USER]"),
        CommandSpec("busy", "what a message sent while I work does here: /busy interrupt|queue|steer "
                    "(default: the channel's)", commands_busy.busy, who=Who.ADMIN,
                    args="[interrupt | queue | steer | default]"),
    ]
)  # fmt: skip
"""Every chat command, in ``/help``'s order. A ``/word`` no row names is not a command."""

parse_command = REGISTRY.parse


def help_text(admin: bool = False) -> str:
    return "\n".join([*REGISTRY.help_lines(admin), "Anything else you write goes to the agent."])


def unknown_text(name: str) -> str:
    return f"Unknown command /{name}. " + help_text()


def new_text(thread_id: str) -> str:
    return f"🆕 Started a fresh conversation (thread {thread_id[:8]})."


# -- running them --------------------------------------------------------------------------------
async def execute(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """Run ``cmd`` for ``entry`` and return the reply, once per journal key (see the module doc)."""
    row = REGISTRY.get(cmd.name)
    if row is None:  # pragma: no cover - parse_command marks only the registry's names known
        return unknown_text(cmd.name)
    if row.recorded:
        done = await ctx.store.command_result(entry.key)
        if done is not None:
            return done
    inbound = entry.inbound
    if row.who is Who.ADMIN and not access.is_admin(ctx.config.access_for(inbound.platform), inbound):
        text = f"Sorry, only an admin of this bot can use /{row.name}."
    else:
        text = await row.handler(ctx, entry, cmd)
    if row.recorded:
        text, _ = await ctx.store.command_result_put(entry.key, text)
    return text


# -- shared with the terminal chat (gateway/cli/chat.py) ------------------------------------------
async def thread_line(harness: AgentHarness, thread_id: str | None) -> str:
    """``Thread: 1a2b3c4d — 12 messages — “title”`` (also the terminal chat's /status)."""
    count = await harness.message_count(thread_id) if thread_id else 0
    title = await harness.title(thread_id) if thread_id else None
    return f"Thread: {thread_id[:8] if thread_id else '(none yet)'} — {count} messages" + (
        f" — {code_span(title, TEXT_CHARS)}" if title else ""
    )


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
