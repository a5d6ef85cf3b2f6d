"""Streaming answers as DingTalk interactive cards (opt-in: ``channels.dingtalk.card_template_id``).

A robot's text message cannot be edited, but a card can. With a card template configured (one the
operator made in DingTalk's card platform, with a Markdown variable named ``card_content_key``),
every message the bot sends is a card: ``POST /v1.0/card/instances/createAndDeliver`` puts it in
the chat (``openSpaceId`` ``dtv1.card//IM_ROBOT.<staff id>`` or ``dtv1.card//IM_GROUP.<conversation
id>``), and each edit is ``PUT /v1.0/card/streaming`` with the whole text so far (``isFull``). The
final text (what :meth:`DingTalkChannel.render` made, marked ``final`` in its payload) is sent with
``isFinalize``, so the card stops showing that it is still being written; a snapshot
(:meth:`render_stream`) is not. The shapes are those of the SDK's ``AICardReplier``
(dingtalk_stream/card_replier.py, 0.24).

The card's ``outTrackId`` is derived from the reply part's idempotency key, so a repeat of a send
whose answer was lost names the same card; whether DingTalk refuses or merges such a repeat is not
documented, so sends are not treated as deduplicated.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from channels.base import ReplyTarget

from .inbound import GROUP_PREFIX
from .openapi import OpenApi

CREATE = "/v1.0/card/instances/createAndDeliver"
STREAM = "/v1.0/card/streaming"
FINAL = "final"
"""Key of :attr:`Rendered.payload` that marks the answer's final text (not a streamed snapshot)."""


def create_body(
    template: str, out: str, params: dict[str, str], chat_id: str, robot: str, *, forward: bool
) -> dict[str, Any]:
    """The ``createAndDeliver`` body of a card from ``template`` with ``params`` into ``chat_id``
    (a group's ``cid…`` id or a user's staff id), its updates called back over Stream; ``forward``:
    whether people may forward it (a card with buttons is not: a press must come from its chat)."""
    body: dict[str, Any] = {
        "cardTemplateId": template,
        "outTrackId": out,
        "cardData": {"cardParamMap": params},
        "callbackType": "STREAM",
        "imGroupOpenSpaceModel": {"supportForward": forward},
        "imRobotOpenSpaceModel": {"supportForward": forward},
    }
    if chat_id.startswith(GROUP_PREFIX):
        body["openSpaceId"] = f"dtv1.card//IM_GROUP.{chat_id}"
        body["imGroupOpenDeliverModel"] = {"robotCode": robot}
    else:
        body["openSpaceId"] = f"dtv1.card//IM_ROBOT.{chat_id}"
        body["imRobotOpenDeliverModel"] = {"spaceType": "IM_ROBOT", "robotCode": robot}
    return body


def track_id(idempotency_key: str) -> str:
    return "chital-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]


class Cards:
    """One app's card calls."""

    def __init__(self, api: OpenApi, robot_code: str, template_id: str, content_key: str) -> None:
        self._api = api
        self._robot = robot_code
        self._template = template_id
        self._key = content_key

    async def create(self, target: ReplyTarget, text: str, idempotency_key: str) -> str:
        """Create the card with ``text`` and deliver it to the chat; its ``outTrackId``."""
        out = track_id(idempotency_key)
        params = {self._key: text}
        await self._api.call(
            CREATE, create_body(self._template, out, params, target.chat_id, self._robot, forward=True)
        )
        return out

    async def update(self, out_track_id: str, text: str, *, final: bool) -> None:
        """The card's text replaced by ``text``; ``final`` ends its streaming."""
        body = {"outTrackId": out_track_id, "guid": uuid.uuid4().hex, "key": self._key, "content": text,
                "isFull": True, "isFinalize": final, "isError": False}  # fmt: skip
        await self._api.call(STREAM, body, method="PUT")
