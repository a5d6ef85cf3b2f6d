"""Approvals and choices as buttons: an interactive card whose buttons call back over Stream.

Opt-in (``channels.dingtalk.button_template_id``): DingTalk shows buttons only in a card made from
a template the operator built in its card platform (docs/setup/dingtalk.md, "Buttons"). The card
is created like a streaming card (``POST /v1.0/card/instances/createAndDeliver``), with two
variables: the text under ``card_content_key`` and the buttons under ``button_list_key`` as a JSON
list of ``{"text", "color", "value"}`` (DingTalk's ``cardParamMap`` holds strings; a template's
loop reads a list from a JSON string). Each button's callback ("回传请求") carries the item's
``value`` back in ``cardPrivateData.params``.

A press arrives as a ``CALLBACK`` frame of topic ``/v1.0/card/instances/callback`` (the SDK's
``Card_Callback_Router_Topic``; subscribed only when buttons are on) whose data the SDK's
``CardCallbackMessage`` reads: ``outTrackId`` (the card), ``userId`` (the presser's staff id, set by
DingTalk: the identity of the press) and ``content`` (JSON with ``cardPrivateData.params``);
``spaceType``/``spaceId`` (read from the raw data, the SDK's model drops them) say where the card was
pressed: ``IM_GROUP`` and the group's ``openConversationId``, or ``IM_ROBOT`` (the presser's 1:1
chat with the robot, whose chat id is the presser's staff id). Nothing in the button's value says
who pressed; a press without a readable presser, card or place is malformed.

After the decision the card is updated (``PUT /v1.0/card/instances``, ``updateCardDataByKey``): the
text shows the decision and the button list is emptied, so no button is left to press.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dingtalk_stream import Card_Callback_Router_Topic, CardCallbackMessage

from channels import malformed
from channels.base import Button, PermanentSendError, ReplyTarget

from .cards import CREATE, create_body, track_id
from .inbound import GROUP_PREFIX
from .openapi import OpenApi

CARD_TOPIC: str = Card_Callback_Router_Topic
UPDATE = "/v1.0/card/instances"
PREFIX = "chital-b-"
"""``outTrackId`` prefix of a buttons card (a streaming card's is ``chital-``): an edit of one
updates its variables, a streamed one is written through ``/v1.0/card/streaming``."""
MAX_BUTTONS = 10
LABEL_CHARS = 30
"""A button's text, cut: DingTalk's buttons show about a dozen CJK characters on a phone."""
COLORS = {"primary": "blue", "danger": "red"}
_HIDDEN = ("Cc", "Cf", "Co", "Cs", "Zl", "Zp")
"""Unicode categories taken out of labels: controls, bidi overrides and zero-width characters
(``Cf``), private use and lone surrogates, line and paragraph separators."""


@dataclass(frozen=True, slots=True)
class Press:
    """A card button press as DingTalk reported it."""

    card: str
    user: str
    chat: str
    value: str
    direct: bool


def label(text: str) -> str:
    """A button's text: visible characters on one line, at most :data:`LABEL_CHARS`, ``@`` as the
    full-width look-alike so the model's text can never read as a mention."""
    kept = "".join(" " if unicodedata.category(c) in _HIDDEN else c for c in text)
    line = " ".join(kept.split()).replace("@", "＠")
    if len(line) > LABEL_CHARS:
        line = line[: LABEL_CHARS - 1].rstrip() + "…"
    return line or "…"


def read_press(data: Any) -> Press:
    """The press in a card callback's data; ``ValueError`` / ``TypeError`` when it cannot be read
    (the caller counts it as a malformed action)."""
    if not isinstance(data, dict):
        raise TypeError("card callback data is no object")
    try:
        msg = CardCallbackMessage.from_dict(data)
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"card callback not readable ({type(exc).__name__})") from None
    user, card = msg.user_id, msg.card_instance_id
    if not malformed.is_id(user) or not malformed.is_id(card) or not card.startswith(PREFIX):
        raise ValueError("card callback without presser or one of our cards")
    content = msg.content if isinstance(msg.content, dict) else {}
    private = content.get("cardPrivateData")
    params = private.get("params") if isinstance(private, dict) else None
    value = params.get("value") if isinstance(params, dict) else None
    if not malformed.is_id(value):
        raise ValueError("card callback without a button value")
    space, where = data.get("spaceType"), data.get("spaceId")
    if space == "IM_GROUP" and malformed.is_id(where) and where.startswith(GROUP_PREFIX):
        return Press(card, user, where, value, direct=False)
    if space == "IM_ROBOT":
        return Press(card, user, user, value, direct=True)
    raise ValueError("card callback from an unknown place")


def press_ids(data: Any) -> tuple[str, str]:
    """The presser and card of a callback that could not be read, where usable (to answer them)."""
    d = data if isinstance(data, dict) else {}
    user, card = d.get("userId"), d.get("outTrackId")
    return (user if malformed.is_id(user) else "", card if malformed.is_id(card) else "")


class ButtonCards:
    """One app's buttons cards (the template the operator made)."""

    def __init__(self, api: OpenApi, robot_code: str, template_id: str, content_key: str,
                 list_key: str) -> None:  # fmt: skip
        self._api = api
        self._robot = robot_code
        self._template = template_id
        self._key = content_key
        self._list = list_key

    async def send(
        self, target: ReplyTarget, text: str, buttons: Sequence[Button], idempotency_key: str
    ) -> str:
        """A card with ``text`` and ``buttons`` in the chat; its ``outTrackId``."""
        if not buttons or len(buttons) > MAX_BUTTONS:
            raise PermanentSendError(f"a DingTalk buttons card shows 1 to {MAX_BUTTONS} buttons")
        if any(not malformed.is_id(b.value) for b in buttons):
            raise PermanentSendError("a button value DingTalk cannot carry back")
        items = [{"text": label(b.label), "color": COLORS.get(b.style, "gray"), "value": b.value}
                 for b in buttons]  # fmt: skip
        out = PREFIX + track_id(idempotency_key).removeprefix("chital-")
        params = {self._key: text, self._list: json.dumps(items, ensure_ascii=False)}
        await self._api.call(
            CREATE, create_body(self._template, out, params, target.chat_id, self._robot, forward=False)
        )
        return out

    async def close(self, out_track_id: str, text: str) -> None:
        """The card shows ``text`` and no buttons (the decision)."""
        body = {
            "outTrackId": out_track_id,
            "cardData": {"cardParamMap": {self._key: text, self._list: "[]"}},
            "cardUpdateOptions": {"updateCardDataByKey": True},
        }
        await self._api.call(UPDATE, body, method="PUT")


__all__ = ["CARD_TOPIC", "PREFIX", "ButtonCards", "Press", "label", "press_ids", "read_press"]
