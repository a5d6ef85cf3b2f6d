"""``/bg TASK`` and ``/tasks [stop ID]``: background tasks from the chat (docs/background-tasks.md).

The handlers of the command layer over gateway/turns/background.py. ``/tasks`` shows each task's
progress as far as the store and the agent's checkpoint can tell from any daemon: how long since it
was asked for, how many steps its agent thread has taken (its model replies and tool results), and
its plan's checklist (k of N done) when it wrote one. A task's text is the user's words: shown as
an inline code span, secrets masked, one line, bounded (like a plan's items, gateway/delivery/plan.py).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from agent.tools.background import BackgroundError
from agent.untrusted import code_span
from gateway.config.durations import in_words
from gateway.config.secrets import redactor_for
from gateway.intake import access
from gateway.store.entries import JournalState

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.store.background import BackgroundTask
    from gateway.store.entries import JournalEntry

LIST_TEXT = 80
"""Characters of a task's text a listing shows."""
_NUMBER = re.compile(r"#?([0-9]{1,40})")
"""ASCII digits only (``str.isdigit`` takes ``²``, which ``int`` refuses)."""
USAGE = "Usage: /tasks lists this conversation's background tasks; /tasks stop ID stops one."


async def bg_command(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/bg TASK``: start TASK in the background; the chat stays free."""
    if ctx.background is None or not ctx.config.tasks.enabled:
        return "Background tasks are off on this bot."
    if not cmd.args.strip():
        return "Usage: /bg TASK — runs TASK in the background while we go on talking; /tasks shows it."
    try:
        task = await ctx.background.start(entry.inbound, entry.key, cmd.args)
    except BackgroundError as exc:
        return f"⚠️ Not started: {exc}."
    return (
        f"🧵 Started background task #{task.id}: {_text(ctx, task)}. I'll reply here with its result; "
        f"meanwhile we can go on talking. /tasks shows its progress, /tasks stop {task.id} stops it."
    )


async def tasks_command(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/tasks`` lists; ``/tasks stop ID`` stops one (its owner or an admin)."""
    args = cmd.args.split()
    if not args:
        return await _listing(ctx, entry)
    if args[0].lower() not in ("stop", "cancel") or len(args) != 2:
        return USAGE
    match = _NUMBER.fullmatch(args[1])
    if match is None:
        return f"{code_span(args[1], 24)} is not a task number: write it in the digits 0-9, like 3."
    if not 0 < int(match.group(1)) < 2**63:  # digits, but no task can have that number
        return f"{code_span(args[1], 24)} is not a task number: they run from 1 to {2**63 - 1}."
    number = int(match.group(1))
    if ctx.background is None:
        return "Background tasks are off on this bot."
    task = await ctx.store.background_get(number)
    inbound = entry.inbound
    if task is None or task.conversation != entry.conversation:
        return f"There is no background task #{number} in this conversation; /tasks shows them."
    if not task.running:
        return f"Background task #{number} has already ended ({_state(task)})."
    if task.owner != inbound.user and not access.is_admin(ctx.config.access_for(inbound.platform), inbound):
        return f"Only {code_span(task.owner)}, who started #{number}, or an admin can stop it."
    return await stop_task(ctx, task, inbound.user)


async def stop_task(ctx: CommandContext, task: BackgroundTask, actor: str) -> str:
    """Stop a running task its stopper may stop, recorded as ``stopped by ACTOR``: ``/tasks stop``
    and the console's Stop button. The outcome in words."""
    number = task.id
    if ctx.background is None:
        return "Background tasks are off on this bot."
    if not await ctx.background.stop(task, f"stopped by {actor}"):
        again = await ctx.store.background_get(number)
        if again is not None and again.running:
            return f"Background task #{number} is sending its result already; it is too late to stop it."
        return f"Background task #{number} has already ended."
    return f"⏹ Stopping background task #{number}."


async def stop_hint(ctx: CommandContext, entry: JournalEntry) -> str:
    """What ``/stop`` adds when background tasks run here: they go on (``/stop`` ends the chat's
    current answer only; a task is stopped by its number)."""
    if ctx.background is None:
        return ""
    running = [t for t in await ctx.store.background_list(entry.conversation, 50) if t.running]
    if not running:
        return ""
    numbers = ", ".join(f"#{t.id}" for t in running)
    return f" Background task(s) {numbers} go on; /tasks stop ID stops one."


async def _listing(ctx: CommandContext, entry: JournalEntry) -> str:
    limit = ctx.config.tasks.listed
    tasks = await ctx.store.background_list(entry.conversation, limit)
    if not tasks:
        return "No background tasks in this conversation. /bg TASK starts one."
    running = [t for t in tasks if t.running]
    lines = [f"Background tasks here ({len(running)} running; at most "
             f"{ctx.config.tasks.max_per_user} per person):"]  # fmt: skip
    for task in [*running, *(t for t in tasks if not t.running)]:
        lines.append(await _line(ctx, task))
    lines.append("/tasks stop ID stops one (its owner or an admin).")
    return "\n".join(lines)


async def _line(ctx: CommandContext, task: BackgroundTask) -> str:
    now = time.time()
    if task.running and task.state == JournalState.WAITING:  # paused on a person, not working
        since = in_words(now - task.created, 2)
        status = f"🔐 waiting for approval (started {since} ago); the request is in this chat"
    elif task.running:
        since = in_words(now - task.created, 2)
        thread_id = await ctx.store.thread_get(f"{task.conversation}:bg:{task.id}")
        count = await ctx.harness.message_count(thread_id) if thread_id else 0
        if thread_id and count:  # its message is in its thread: the agent works on it
            parts = [f"running for {since}", f"{count - 1} step(s)"]
            items = await ctx.harness.plan(thread_id)
            if items:
                done = sum(item.status == "completed" for item in items)
                parts.append(f"plan {done}/{len(items)} done")
        else:
            parts = [f"waiting for a free slot (asked {since} ago)"]
        status = "⏳ " + ", ".join(parts)
    else:
        ago = in_words(now - (task.finished_at or task.updated), 1)
        status = f"{_mark(task)} {_state(task)} {ago} ago"
    return f"#{task.id} {status} — by {code_span(task.owner)}: {_text(ctx, task)}"


def _state(task: BackgroundTask) -> str:
    if task.ended is not None:
        return code_span(task.ended, 60)
    return {"done": "finished", "failed": "failed", None: "gone from the journal"}.get(task.state, "ended")


def _mark(task: BackgroundTask) -> str:
    if task.ended is not None:
        return "⏹"
    return "✅" if task.state == "done" else "⚠️"


def _text(ctx: CommandContext, task: BackgroundTask) -> str:
    """The task's words as the chat shows them: secrets masked first, then one bounded code span."""
    return code_span(redactor_for(ctx.config)(task.text), LIST_TEXT)
