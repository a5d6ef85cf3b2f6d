"""Where what the model has read came from: the provenance of actions with lasting effect.

A schedule, a remembered fact or any other action that outlives the turn can be written by the
model after it read text someone other than the requester wrote: a stranger's message quoted as
thread context, a web page, a search result, an MCP tool's answer, a file's contents. A gullible
model may then turn an instruction hidden in that text into a schedule that later runs "as the
user". So every lasting action records which untrusted sources were in the model's context when
it was made (docs/security.md, "Provenance of lasting actions").

The record is not kept beside the messages but read from them: the sources are exactly what the
checkpointed state holds, so no tool or middleware can forget to update it, a turn resumed after a
crash or an approval sees the same record, and ``/new`` (a new thread) starts clean.

- A **HumanMessage** carries, in ``additional_kwargs[PROVENANCE_KEY]``, the sources its input came
  with: quoted thread context by anyone but this bot, and what a firing inherits from the tainted
  schedule it runs (the gateway passes that in :class:`agent.turn.TurnOptions`). A user cannot set
  it: it is never read from text.
- A **ToolMessage** is untrusted unless its tool is one of :data:`OWN_TOOLS`, whose results are the
  bot's own bookkeeping; an own tool that shows text an untrusted source wrote (``list_schedules``
  on a tainted schedule) carries that text's sources in ``additional_kwargs[PROVENANCE_KEY]``.
  Deny by default: a tool added later (an MCP server, a skill's tool, a background task) counts
  as reading untrusted content until it is listed here.

The scope is the whole thread the model sees, not only the current turn: a page fetched three
messages ago is still in the context a later turn answers from. A lasting tool calls
:func:`provenance_of_call` (the generic hook) and stores :meth:`Provenance.to_json` with its object.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import AnyMessage, BaseMessage

    from agent.turn import ContextMessage

PROVENANCE_KEY = "chital_provenance"
"""``HumanMessage.additional_kwargs`` key: the untrusted sources that came with the turn's input."""

OWN_TOOLS = frozenset(
    {
        "schedule_task",
        "list_schedules",
        "cancel_schedule",
        "ask_clarification",
        "present_files",
        "write_todos",
        "write_file",
        "edit_file",
        "load_skill",
    }
)
"""Tools whose results are the bot's own bookkeeping (or the operator's skills), not text someone
else wrote. Every other tool's result counts as untrusted: ``read_file`` and ``execute`` return what
a file or a program says (an uploaded document, a downloaded page), ``task`` what a sub-agent made
of whatever it read."""

WEB_PAGE, WEB_SEARCH, MESSAGE, TOOL, SCHEDULED, SUBAGENT = (
    "web page",
    "web search",
    "message",
    "tool",
    "scheduled task",
    "sub-agent",
)
FORWARDED_MESSAGE = "forwarded message"
"""The turn's own message is someone else's words, forwarded or shared by the sender (its label:
the original author). Unlike quoted context, it is the message itself: memory does not learn it
as the user's words (agent/memory/service.py)."""
WEBHOOK = "webhook event"
"""The turn's own message is an HTTP delivery's payload (gateway/turns/hooks.py): nobody's words
the bot can vouch for; its label: the hook's name."""
NOT_THE_USERS_WORDS = frozenset({SCHEDULED, FORWARDED_MESSAGE, WEBHOOK})
"""Kinds of source that make a turn's own message text someone else's, not the user's."""
LABEL_CHARS = 120
SHOWN_SOURCES = 5

_INVISIBLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)
_BRACKETS = re.compile(r"[\[\]<>`]")


def clean_label(text: str, limit: int = LABEL_CHARS) -> str:
    """A source's label (a URL, an author's name, a query) safe to quote anywhere: one line,
    no control, zero-width or bidirectional characters, no brackets that could close a block,
    at most ``limit`` characters."""
    text = _INVISIBLE.sub(" ", unicodedata.normalize("NFC", str(text)))
    text = " ".join(_BRACKETS.sub("", text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Source:
    """One untrusted source: its kind (:data:`WEB_PAGE`, :data:`MESSAGE` ...) and what names it."""

    kind: str
    label: str = ""

    def describe(self) -> str:
        label = clean_label(self.label)
        if self.kind == MESSAGE:
            return f"a message by {label or 'someone'}"
        if self.kind == FORWARDED_MESSAGE:
            return f"a message by {label or 'someone'} (forwarded)"
        if self.kind == WEB_PAGE:
            return f"the web page {label}" if label else "a web page"
        if self.kind == WEB_SEARCH:
            return f"web search results for “{label}”" if label else "web search results"
        if self.kind == SCHEDULED:
            return f"scheduled task {label}" if label else "a scheduled task"
        if self.kind == SUBAGENT:
            return "a sub-agent's work"
        if self.kind == WEBHOOK:
            return f"the payload of the webhook {label}" if label else "a webhook's payload"
        return f"the output of the tool {label}" if label else "a tool's output"


@dataclass(frozen=True, slots=True)
class Provenance:
    """The untrusted sources in the model's context when a lasting action was made (none: the
    action came from the requester's own words only)."""

    sources: tuple[Source, ...] = ()

    @property
    def tainted(self) -> bool:
        return bool(self.sources)

    def describe(self, shown: int = SHOWN_SOURCES) -> str:
        """The sources in words, the first ``shown`` of them: ``a message by Mallory; the web
        page https://…``."""
        parts = [s.describe() for s in self.sources[:shown]]
        more = len(self.sources) - shown
        if more > 0:
            parts.append(f"and {more} more")
        return "; ".join(parts)

    def to_json(self) -> str | None:
        """For a database column; None when untainted (so untainted rows stay as they were)."""
        if not self.sources:
            return None
        return json.dumps([[s.kind, s.label] for s in self.sources], ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: Any) -> Provenance:
        """The inverse of :meth:`to_json`; anything unreadable is one unnamed source (a row that
        says it is tainted never reads as clean)."""
        if raw in (None, ""):
            return cls()
        try:
            data = json.loads(raw) if isinstance(raw, str) else raw
            return cls(_dedup(Source(str(k), str(v)) for k, v in data))
        except (TypeError, ValueError):
            return cls((Source(TOOL),))

    def merged(self, *others: Iterable[Source]) -> Provenance:
        return Provenance(_dedup([*self.sources, *(s for o in others for s in o)]))


UNTAINTED = Provenance()
"""No untrusted source: the action came from the requester's own words."""


def _dedup(sources: Iterable[Source]) -> tuple[Source, ...]:
    return tuple(dict.fromkeys(Source(s.kind, clean_label(s.label)) for s in sources))


def of_context(context: Sequence[ContextMessage]) -> list[Source]:
    """Quoted thread messages by anyone but this bot. The requester's own earlier messages count
    too: a platform names a context message's author by display name only, which anyone can copy."""
    return [Source(MESSAGE, m.author) for m in context if not m.is_bot]


def untrusted_tool(name: str) -> bool:
    return name not in OWN_TOOLS


def of_messages(messages: Sequence[AnyMessage | BaseMessage]) -> Provenance:
    # Imported here: the store (and with it every CLI command) imports this module for Provenance,
    # and langchain-core's messages bring requests along before the CLI defers what it never uses.
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    """The untrusted sources among ``messages`` (a thread's state, as the model sees it)."""
    calls: dict[str, Mapping[str, Any]] = {}
    found: list[Source] = []
    for message in messages:
        if isinstance(message, AIMessage):
            calls.update({str(c.get("id")): c for c in message.tool_calls})
        elif isinstance(message, HumanMessage):
            found.extend(Provenance.from_json(message.additional_kwargs.get(PROVENANCE_KEY)).sources)
        elif isinstance(message, ToolMessage):
            if untrusted_tool(str(message.name or "")):
                found.append(_tool_source(str(message.name or ""), calls.get(message.tool_call_id)))
            # An own tool showing text an untrusted source wrote (list_schedules on a tainted
            # schedule) says so; set by the tool itself, never read from the text.
            found.extend(Provenance.from_json(message.additional_kwargs.get(PROVENANCE_KEY)).sources)
    return Provenance(_dedup(found))


def _tool_source(name: str, call: Mapping[str, Any] | None) -> Source:
    args = (call or {}).get("args") or {}
    if name == "web_fetch":
        return Source(WEB_PAGE, str(args.get("url") or ""))
    if name == "web_search":
        return Source(WEB_SEARCH, str(args.get("query") or ""))
    if name == "task":
        return Source(SUBAGENT)
    return Source(TOOL, name)


def provenance_of_call(state: Any, message_id: str) -> Provenance:
    """The generic hook for a tool with lasting effect: the provenance of a call made with the
    graph ``state`` (``ToolRuntime.state``) while answering ``message_id``. A state that does not
    hold that message is a sub-agent's (its task was written by the lead, from whatever the lead
    read) or unreadable: tainted, deny by default."""
    from langchain_core.messages import HumanMessage

    messages = state.get("messages", ()) if isinstance(state, Mapping) else ()
    found = of_messages(messages)
    if not any(isinstance(m, HumanMessage) and m.id == message_id for m in messages):
        found = found.merged([Source(SUBAGENT)])
    return found
