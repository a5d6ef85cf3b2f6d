"""Buttons on WeCom: ``button_interaction`` template cards, their presses, and their updates.

Frames (checked against WeCom's Node SDK ``src/types/api.ts`` / ``event.ts`` / ``client.ts``, see
docs/setup/wecom.md section 8):

* a card goes out proactively (``aibot_send_msg``, ``msgtype: template_card``): a card is asked for
  in the middle of a turn whose message already has its one reply (the stream), WeCom takes one
  card per message, and a card must outlive the 6-minute reply window anyway;
* a press arrives as ``aibot_event_callback`` with ``event.eventtype: template_card_event``,
  ``event.event_key`` (the button's ``key``) and ``event.task_id`` (the card's), the presser in
  ``from.userid`` and the group in ``chatid``;
* within 5 seconds of that event its ``req_id`` may carry ``aibot_respond_update_msg``
  (``response_type: update_template_card``), which replaces the card (for everyone, or only for
  ``userids``). Later the card cannot change: the decision goes out as a message of its own and the
  buttons stay, a later press being answered "already settled" by the gateway.

Provenance: the presser is ``from.userid`` of the event, never anything in the button. The card's
``task_id`` carries a digest of the chat it was sent to (``t<key digest>_<chat digest>``), so a
press relayed from another chat, or a ``task_id`` this bot never made, is refused here without
any state that a restart would lose.

Bounds (WeCom's, from the SDK's types): at most 6 buttons; a key at most 1,024 bytes; a
``task_id`` of ``[A-Za-z0-9_\\-@]``, at most 128 bytes; a button's text "best at most 10
characters" (cut at :data:`LABEL_CHARS` here), a title 26, the secondary text 112 (longer text goes
first as a markdown message). Labels are the model's or a user's text: one line, mentions broken.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from channels import malformed
from channels.base import Button, PermanentSendError

from .inbound import obj

CARD = "template_card"
EVENT = "template_card_event"
MAX_BUTTONS = 6
KEY_BYTES = 1024
LABEL_CHARS = 16
TITLE_CHARS = 26
SUB_CHARS = 112
UPDATE_WINDOW = 4.0
"""Seconds after a press during which the card is updated in place (WeCom allows 5)."""
STYLES = {"primary": 1, "danger": 2}
"""Our button styles -> WeCom's ``style`` (1 to 4; WeCom's clients draw 1 as the main colour)."""
_TASK = re.compile(r"\At([0-9a-f]{24})_([0-9a-f]{12})\Z")
_INERT = str.maketrans({"<": "‹", ">": "›", "@": "＠"})
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\r\n\t]+")


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def task_id(idempotency_key: str, chat_id: str) -> str:
    """The card's ``task_id``: stable for one key (a repeated send is the same card), bound to
    its chat (see the module docstring)."""
    return f"t{_digest(idempotency_key, 24)}_{_digest(chat_id, 12)}"


def message_id(task: str) -> str:
    return f"c|{task}"


def task_of(message: str) -> str:
    kind, _, task = message.partition("|")
    return task if kind == "c" and _TASK.match(task) else ""


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (a card shows no Markdown: bold marks and backticks are dropped),
    without invisible or direction-changing characters, at most ``limit``
    characters; ``<``, ``>`` and ``@`` as look-alikes, so no ``<@userid>`` or ``@all`` in it pings
    anyone (one character each, so the bound holds)."""
    flat = " ".join(_INVISIBLE.sub(" ", text).replace("**", "").replace("`", "").split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat.translate(_INERT)


def card_body(task: str, text: str, buttons: Sequence[Button]) -> dict[str, Any]:
    """A ``button_interaction`` card for ``text`` (fitting: see :func:`fits`) and ``buttons``."""
    if not 1 <= len(buttons) <= MAX_BUTTONS:
        raise PermanentSendError(f"a WeCom card holds 1 to {MAX_BUTTONS} buttons, not {len(buttons)}")
    listed = []
    for b in buttons:
        if len(b.value.encode()) > KEY_BYTES or not b.value.isprintable():
            raise PermanentSendError("a button's value does not fit a WeCom card key")
        item: dict[str, Any] = {"text": one_line(b.label, LABEL_CHARS) or "…", "key": b.value}
        if b.style in STYLES:
            item["style"] = STYLES[b.style]
        listed.append(item)
    if len({b.value for b in buttons}) != len(buttons):
        raise PermanentSendError("two buttons with one value (WeCom's keys must differ)")
    title, _, rest = text.strip().partition("\n")
    card: dict[str, Any] = {"card_type": "button_interaction", "task_id": task,
                            "main_title": {"title": one_line(title, TITLE_CHARS) or "…"},
                            "button_list": listed}  # fmt: skip
    if rest.strip():
        card["sub_title_text"] = one_line(rest, SUB_CHARS)
    return card


def fits(text: str) -> bool:
    """``text`` shows whole on a card (a short title, a short second line)."""
    title, _, rest = text.strip().partition("\n")
    flat = " ".join(rest.split())
    return len(title) <= TITLE_CHARS and len(flat) <= SUB_CHARS


def closed_card(task: str, text: str) -> dict[str, Any]:
    """What replaces a card once decided: a ``text_notice`` card with the same ``task_id`` (WeCom
    matches the update by it) showing the decision and no buttons."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    decision = lines[-1] if lines else "…"
    title = lines[0] if len(lines) > 1 else "…"
    return {"card_type": "text_notice", "task_id": task,
            "main_title": {"title": one_line(title, TITLE_CHARS)},
            "sub_title_text": one_line(decision, SUB_CHARS)}  # fmt: skip


class OtherChat(ValueError):
    """A press of a real card in another chat than it was sent to (a relayed or forged event)."""


def note_for(error: ValueError) -> str:
    """What the presser of an unusable press reads."""
    if isinstance(error, OtherChat):
        return "⛔ That button belongs to another chat."
    return malformed.ACTION_UNREADABLE


@dataclass(frozen=True, slots=True)
class Press:
    """A readable ``template_card_event``: who pressed what on which card, in which chat."""

    chat_id: str
    sender_id: str
    key: str
    task: str
    msgid: str


def read_press(body: Any) -> Press:
    """The :class:`Press` of an event body; ``ValueError`` when an id is missing or unusable, the
    ``task_id`` is none of ours, or it was pressed in another chat than it was sent to."""
    body = obj(body)
    event = obj(body.get("event"))
    sender = obj(body.get("from")).get("userid")
    if not malformed.is_id(sender):
        raise ValueError("a press without a usable from.userid")
    group = body.get("chattype") == "group"
    chat = body.get("chatid") if group else sender
    if not malformed.is_id(chat):
        raise ValueError("a group press without a usable chatid")
    key, task, msgid = event.get("event_key"), event.get("task_id"), body.get("msgid")
    if not isinstance(key, str) or not key or len(key.encode()) > KEY_BYTES or not key.isprintable():
        raise ValueError("a press without a usable event_key")
    found = _TASK.match(task) if isinstance(task, str) else None
    if found is None:
        raise ValueError("a press on a card this bot did not send")
    if found.group(2) != _digest(chat, 12):
        raise OtherChat("a press in another chat than the card's")
    return Press(chat, sender, key, found.group(0), msgid if malformed.is_id(msgid) else "")
