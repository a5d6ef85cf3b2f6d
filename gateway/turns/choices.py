"""A clarifying question with options, as buttons (docs/choices.md).

When a turn ends on ``ask_clarification`` with ``options`` (agent/tools/clarify.py), the answer
says the question and :meth:`Choices.post` puts one message under it: the options numbered, with
one button per option where the platform has buttons (``ask:CODE:n``: a short code and an index,
never the option text, within Telegram's 64 bytes of callback data). A typed answer always works;
a typed number is read as that option.

A press is checked (the person asked or an admin; still the conversation's open question, read
from the agent's checkpoint; a real option) and then journaled *as the user's answer*: an inbound
message whose text is the option, sent by the presser, keyed on the buttons message. The journal's
insert-once is the decision (two presses, or one press delivered twice: one wins) and makes it
durable (a kill -9 after the press resumes that turn at start-up, like any journaled message).
The turn replies to the buttons message, and the buttons are closed showing who chose what.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from agent.untrusted import code_span, one_line
from channels.base import Action, ActionAnswer, Button, Inbound, PermanentSendError
from channels.messages import FORWARDED, REPLIED, REPLIED_FILE
from gateway.config.secrets import redactor_for
from gateway.intake.access import STARTED_BY_BOT, Verdict, decide, is_admin
from gateway.store.entries import AtClaim, JournalEntry
from gateway.turns import usage

if TYPE_CHECKING:
    from channels.base import Channel
    from gateway.agent_api import AgentHarness
    from gateway.config.schema import Config
    from gateway.store.choices import ChoiceRow
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

PREFIX = "ask"
CHOICE_MARK = "chital_choice"
""":attr:`Inbound.extra` key of an answer made by a press: the question's code."""
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
LABEL_CHARS = 40
"""Characters of an option on its button (Slack allows 75, Discord 80; Telegram shows about 64 bytes)."""
OPTION_CHARS = 60
"""Characters of an option in the numbered list (the tool refuses longer ones)."""
_INERT = str.maketrans({"<": "‹", ">": "›", "@": "＠"})
_MARKUP = str.maketrans(
    {"[": "［", "]": "］", "(": "（", ")": "）", "*": "∗", "_": "＿", "~": "∼", "|": "ǀ", "`": "ˋ"}
)
_DROP = (REPLIED, REPLIED_FILE, FORWARDED)
"""What the asking message carried that the answer must not carry again."""
_GATEWAY_MARKS = "chital_"
"""The gateway's own marks on the asking message (a schedule's firing, a hook's delivery, a
background task, started by the bot, an interrupted turn, its input's provenance): the press is the
presser's own new message, so it carries none of them; only the platform's keys (a Slack thread,
a Discord guild) stay. A tainted thread stays tainted: provenance is read from the whole thread."""


def body(options: tuple[str, ...], buttons: bool, redact: Callable[[str], str]) -> str:
    """The numbered options, inert: each a code span (no links, mentions or markup), one line,
    bounded, invisible characters removed, the daemon's secrets masked."""
    lines = [f"{n}. {code_span(redact(o), OPTION_CHARS)}" for n, o in enumerate(options, 1)]
    how = "Press a button or type your answer." if buttons else "Reply with a number or your own answer."
    return "\n".join([*lines, "", how])


def label(option: str, redact: Callable[[str], str]) -> str:
    """A button's text: plain on every platform, visible, one line, bounded; ``<>@`` as look-alikes
    so no client can read ``<!channel>`` or ``@everyone`` in it as a mention."""
    return one_line(redact(option), LABEL_CHARS).translate(_INERT) or "…"


def toast(option: str, redact: Callable[[str], str]) -> str:
    """The option echoed to the presser (a Telegram or Lark toast, a Discord ephemeral reply,
    which renders Markdown): the label, with Markdown's link, emphasis and spoiler marks as
    look-alikes and ``://`` broken, so no client shows the model's text as a link or markup."""
    return label(option, redact).translate(_MARKUP).replace("://", "∶//")


class Choices:
    """Posts questions' options and answers presses; ``start`` journals and runs a turn once
    (the Gateway's ``start_turn``)."""

    def __init__(
        self,
        config: Config,
        store: Store,
        harness: AgentHarness,
        channels: Mapping[str, Channel],
        start: Callable[[Inbound], Awaitable[bool]],
    ) -> None:
        self.config, self.store, self.harness = config, store, harness
        self.channels, self.start = channels, start
        self.redact = redactor_for(config)

    async def post(self, entry: JournalEntry, thread_id: str) -> None:
        """Post the options of the question ``entry``'s turn ended on (once, also on a replay)."""
        found = await self.harness.open_choices(thread_id)
        if found is None:
            return
        _, options = found
        row = await self.store.choice_add(_code(), entry.key, entry.conversation)
        if row.message_id:
            return
        channel = self.channels[entry.inbound.platform]
        target = entry.inbound.target
        key = f"choices:{row.code}"
        message_id = ""
        if channel.capabilities.buttons:
            buttons = [
                Button(label(o, self.redact), f"{PREFIX}:{row.code}:{n}") for n, o in enumerate(options)
            ]
            part = channel.render(body(options, True, self.redact))[0]
            try:
                message_id = await channel.send_buttons(target, part, buttons, idempotency_key=key)
            except PermanentSendError as exc:
                log.warning("choices %s: buttons refused on %s (%s)", row.code, channel.name, exc)
        if not message_id:
            part = channel.render(body(options, False, self.redact))[0]
            message_id = await channel.send(target, part, idempotency_key=key)
        await self.store.choice_sent(row.code, message_id)
        log.info("choices %s: %d options asked in %s", row.code, len(options), entry.conversation)

    async def typed(self, entry: JournalEntry, thread_id: str, text: str) -> str:
        """A typed number of an open question's options reads as that option's text, when the
        person asked (or an admin) typed it: anyone else's ``2`` stays their own ``2``, as only the
        person asked may choose; a message the bot started (a schedule's firing whose prompt is
        "1") is nobody's typing. Only ASCII digits count (``"²".isdigit()`` is true, but
        ``int("²")`` raises)."""
        typed = text.strip()
        if CHOICE_MARK in entry.inbound.extra or STARTED_BY_BOT in entry.inbound.extra or not _index(typed):
            return text
        found = await self.harness.open_choices(thread_id)
        n = int(typed)
        if found is None or not 1 <= n <= len(found[1]):
            return text
        row = await self.store.choice_latest(entry.conversation)
        asked = await self.store.journal_inbound(row.key) if row else None
        inbound = entry.inbound
        admin = is_admin(self.config.access_for(inbound.platform), inbound)
        if asked is None or (inbound.user != asked.user and not admin):
            return text
        return found[1][n - 1]

    async def on_action(self, action: Action) -> ActionAnswer:
        """A press: checked, journaled once as the presser's answer, answered to the presser."""
        parts = action.value.split(":")
        if len(parts) != 3 or parts[0] != PREFIX or not _index(parts[2]):
            return ActionAnswer("This button is not mine to answer.", refused=True)
        row = await self.store.choice_by_code(parts[1])
        asked = await self.store.journal_inbound(row.key) if row else None
        elsewhere = asked is not None and (asked.platform, asked.chat_id) != (action.platform, action.chat_id)
        if row is None or asked is None or elsewhere:
            return ActionAnswer("This question no longer exists.", refused=True)
        admin = is_admin(self.config.access_for(action.platform), _probe(action))
        if action.user != asked.user and not admin:
            who = code_span(asked.sender_name) if asked.sender_name else "the person asked"
            return ActionAnswer(f"⛔ Not yours to answer: only {who} or an admin can.", refused=True)
        if not row.message_id and action.message_id:  # pressed before its id was on record
            await self.store.choice_sent(row.code, action.message_id)  # the platform names it
            row = await self.store.choice_by_code(row.code) or row
        if not row.message_id:
            return ActionAnswer("One moment: this question is still being posted.", refused=True)
        if action.message_id and action.message_id != row.message_id:
            return ActionAnswer("This button does not belong to this question.", refused=True)
        answer = _answer(row, asked, action, "")
        if await self.store.journal_seen(answer.key):
            return ActionAnswer("This question was already answered.", refused=True)
        latest = await self.store.choice_latest(row.conversation)
        found = await self.harness.open_choices(await self.store.thread_for(row.conversation))
        if row.closed or latest is None:
            return ActionAnswer("This question was already answered; type your answer instead.", refused=True)
        if latest.code != row.code:
            return ActionAnswer("A newer question was asked since; answer that one.", refused=True)
        if found is None:  # no turn ran since (it would have closed the row): the thread was reset
            return ActionAnswer("This conversation was started afresh (/new) since; ask again.", refused=True)
        if await self.store.choice_answer_waiting(row.conversation, row.key):
            return ActionAnswer("A newer message in this chat is already being answered.", refused=True)
        n = int(parts[2])
        if n >= len(found[1]):
            return ActionAnswer("That is not one of the options.", refused=True)
        if not admin:
            allowed = await decide(asked, self.config.access_for(asked.platform), self.store, True)
            if allowed.verdict is not Verdict.ALLOW:
                return ActionAnswer("⛔ You no longer have access to this bot.", refused=True)
        refusal = await usage.budget_refusal(self.store, self.config, action.user, admin)
        if refusal is not None:
            return ActionAnswer(refusal, refused=True)
        option = found[1][n]
        if not await self.start(_answer(row, asked, action, option)):
            return ActionAnswer("This question was already answered.", refused=True)
        log.info("choices %s: option %d chosen by %s", row.code, n + 1, action.user)
        return ActionAnswer(f"✔ {toast(option, self.redact)}")  # inert like the label, and no Markdown

    async def close(self, entry: JournalEntry, at_claim: AtClaim | None = None) -> None:
        """At the start of a turn in a conversation with open buttons: close them, showing the
        choice (this turn is the press) or that the question was answered in the chat. Run by
        every turn, so a restart between the press and the close still closes them. ``at_claim``:
        what the turn's claim saw (no open question: nothing to read)."""
        if at_claim is not None and not at_claim.choice_open:
            return
        row = await self.store.choice_latest(entry.conversation)
        if row is None or not row.message_id or row.key == entry.key:
            return
        if not await self.store.choice_close(row.code):
            return
        asked = await self.store.journal_inbound(row.key)
        channel = self.channels.get(entry.inbound.platform)
        if asked is None or channel is None:
            return
        pressed = entry.inbound.extra.get(CHOICE_MARK) == row.code
        who = code_span(self.redact(entry.inbound.sender_name or entry.inbound.sender_id))
        what = code_span(self.redact(entry.inbound.text), OPTION_CHARS)
        note = f"✔ {what} — chosen by {who}" if pressed else "✔ Answered in the chat."
        found = await self.harness.open_choices(await self.store.thread_for(row.conversation))
        listed = body(found[1], False, self.redact).rsplit("\n", 1)[0] if found else ""
        part = channel.render(f"{listed}\n{note}" if listed else note)[0]
        with contextlib.suppress(Exception):  # the answer holds whether or not the buttons show it
            await channel.close_buttons(asked.target, row.message_id, part)


def _index(text: str) -> bool:
    """An option's number as a button or a person writes it: one or two ASCII digits (no sign,
    no superscript or other Unicode digit ``int`` cannot read or would read unexpectedly)."""
    return 1 <= len(text) <= 2 and text.isascii() and text.isdigit()


def _code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(8))


def _probe(action: Action) -> Inbound:
    return Inbound(action.platform, action.chat_id, "", action.sender_id, "", False, False)


def _answer(row: ChoiceRow, asked: Inbound, action: Action, option: str) -> Inbound:
    """The presser's answer as a message: keyed on the buttons message (so one press wins, and
    the answer replies to the question), in the asking message's conversation, with none of the
    gateway's marks the asking message had (a hook's or a schedule's question is answered by a
    person: their words, not the hook's payload or a firing)."""
    extra = {k: v for k, v in asked.extra.items() if k not in _DROP and not k.startswith(_GATEWAY_MARKS)}
    extra[CHOICE_MARK] = row.code
    return Inbound(
        platform=asked.platform,
        chat_id=asked.chat_id,
        message_id=row.message_id,
        sender_id=action.sender_id,
        text=option,
        is_direct=asked.is_direct,
        addressed=True,
        thread_id=asked.thread_id,
        sender_name=action.sender_name,
        chat_title=asked.chat_title,
        extra=extra,
    )
