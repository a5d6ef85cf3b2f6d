"""Fact extraction: the prompt, the tolerant reading of the model's JSON, and applying the plan.

Why plain JSON in the text and not ``with_structured_output``: the extraction uses whatever chat
model the lead agent uses, and tool-calling/JSON-schema support differs between providers and local
servers. A strict instruction plus a forgiving parser (code fences and prose around the object are
stripped) works everywhere; an answer that still is not the expected object is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, ValidationError

from agent.memory.facts import Fact, PendingTurn

log = logging.getLogger(__name__)

MARKER = "MEMORY EXTRACTION"
"""First words of the extraction request's user message (tests and logs recognise it by them)."""

MAX_FACT_CHARS = 300

SYSTEM = """\
You maintain the long-term memory of a chat assistant about ONE user: the person who wrote the \
"user" lines below. Read the new conversation turns and decide what is worth remembering about \
this user in future conversations: stable preferences, background, role, projects, tools they \
use, people and things they care about, explicit requests to remember something.

Rules:
- Each fact is one short, self-contained sentence about the user, in the third person \
("Prefers answers in German.", "Works on the billing service in Go."). One fact per item.
- Only what the user said or clearly confirmed. Ignore small talk, one-off task details, what \
the assistant said on its own, and facts about other people unless they concern the user.
- Never store secrets: passwords, API keys, tokens, private keys, card numbers.
- Compare with the known facts. If a turn contradicts, corrects or refines a known fact, UPDATE \
that fact (keep its id). If the user says a known fact no longer holds or asks you to forget it, \
DELETE it. Never add a fact that is already known.
- Nothing worth remembering is a normal outcome: return empty lists.

Answer with ONE JSON object and nothing else (no prose, no code fence), exactly this shape:
{"add": ["new fact", ...], "update": [{"id": "<known id>", "text": "new text"}, ...], \
"delete": ["<known id>", ...]}"""


class _Update(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    text: str


class ExtractionPlan(BaseModel):
    """What the model asked to change."""

    model_config = ConfigDict(extra="ignore")
    add: list[str] = []
    update: list[_Update] = []
    delete: list[str] = []


class BadExtraction(ValueError):
    """The model's answer was not the JSON object we asked for."""


def build_messages(known: Sequence[Fact], turns: Sequence[PendingTurn]) -> list[Any]:
    """The extraction request: the instruction, the known facts with ids, the new turns."""
    facts = [{"id": f.id, "text": f.text} for f in known]
    lines: list[str] = []
    for turn in turns:
        for role, text in turn.lines:
            lines.append(f"[{role}] {text}")
        lines.append("")
    body = (
        f"{MARKER}\n\nKnown facts about the user (JSON):\n{json.dumps(facts, ensure_ascii=False)}\n\n"
        "New conversation turns (oldest first):\n" + "\n".join(lines).rstrip()
    )
    return [SystemMessage(SYSTEM), HumanMessage(body)]


def parse_plan(text: str) -> ExtractionPlan:
    """Read the model's answer; raises ``BadExtraction`` when no valid plan object is in it."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise BadExtraction("no JSON object in the answer")
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise BadExtraction(f"invalid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise BadExtraction("the JSON is not an object")
    try:
        return ExtractionPlan.model_validate(data)
    except ValidationError as exc:
        raise BadExtraction(f"unexpected shape ({exc.error_count()} errors)") from None


@dataclass
class Changes:
    """Facts to write and ids to delete, after checking the plan against what is known."""

    put: list[Fact] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)


def clean_fact(text: str) -> str:
    """One line, single spaces, at most MAX_FACT_CHARS."""
    return " ".join(str(text).split())[:MAX_FACT_CHARS]


def apply_plan(plan: ExtractionPlan, known: Sequence[Fact], *, now: datetime, source: str) -> Changes:
    """Turn a plan into concrete writes. Unknown ids are ignored (the model invents some); a
    deleted id cannot be updated too; an added text equal to a known one is not duplicated."""
    by_id = {f.id: f for f in known}
    changes = Changes()
    deleted = {i for i in plan.delete if i in by_id}
    changes.delete = sorted(deleted)
    texts = {f.text.casefold() for f in known if f.id not in deleted}
    for upd in plan.update:
        old = by_id.get(upd.id)
        text = clean_fact(upd.text)
        if old is None or upd.id in deleted or not text:
            continue
        if text == old.text:
            continue
        changes.put.append(Fact(old.id, text, old.created_at, now, source))
        texts.add(text.casefold())
    for raw in plan.add:
        text = clean_fact(raw)
        if not text or text.casefold() in texts:
            continue
        texts.add(text.casefold())
        changes.put.append(Fact(new_id(by_id), text, now, now, source))
    return changes


def new_id(taken: dict[str, Fact]) -> str:
    """A short random id (the model copies ids back, so short is cheaper and safer)."""
    while True:
        fid = "f" + secrets.token_hex(4)
        if fid not in taken:
            return fid
