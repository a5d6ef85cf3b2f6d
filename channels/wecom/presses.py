"""Presses of WeCom card buttons (``template_card_event``), read, remembered and answered.

A readable press goes to the gateway once (WeCom may send an event again: its ``msgid`` is
remembered), as pressed by the event's ``from.userid`` (channels/wecom/cards.py ``read_press``).
What the presser is told goes to the chat as a message of its own, since WeCom has no answer
only the presser sees: a refusal at once (a few a minute per presser at most), an accepted
press's note only when the card was not closed meanwhile (approvals and choices close it and show
the decision there; a skill draft's buttons do not). Every send is a task of its own: its answer
comes through the read loop that handles the press, which must never wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from channels import malformed
from channels.base import Action, ActionAnswer, ChannelError, RetryAfter

from . import cards
from .inbound import ids_of

log = logging.getLogger(__name__)
KEPT = 4096


class Presses:
    """Each card's latest press (its ``req_id`` may update the card for a few seconds), the events
    handled, the cards closed, the refusals told; all bounded."""

    def __init__(
        self,
        platform: str,
        hand: Callable[[Action], Awaitable[ActionAnswer]],
        say: Callable[[str, str], Awaitable[None]],
        count: Callable[[str], None],
    ) -> None:
        self._platform, self._hand, self._say, self._count = platform, hand, say, count
        self._latest: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._refusals = malformed.Refusals()
        self._quiet = malformed.LogLimit()
        """Log lines of refused presses, at most a few a minute."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, req_id: str, body: Any) -> None:
        """One ``template_card_event``; never raises for the event's sake."""
        try:
            press = cards.read_press(body)
        except ValueError as exc:
            self._count(malformed.ACTION)
            if (more := self._quiet.allow("press")) is not None:
                log.warning("wecom: a card press refused: %s%s", exc, more)
            ids = ids_of(body)
            if ids["chat_id"] and ids["sender_id"] and self._may_tell(ids["chat_id"], ids["sender_id"]):
                self._spawn(self._say(ids["chat_id"], cards.note_for(exc)))
            return
        if not self._note(press, req_id):
            return  # WeCom sent this event again
        action = Action(
            self._platform, press.chat_id, press.sender_id, press.key, cards.message_id(press.task)
        )
        try:
            answer = await self._hand(action)
        except ChannelError as exc:  # never out of the read loop
            log.warning("wecom: a card press was not handled: %s", type(exc).__name__)
            answer = ActionAnswer(malformed.ACTION_UNREADABLE, refused=True)
        if not answer.text:
            return
        if answer.refused:
            if self._may_tell(press.chat_id, press.sender_id):
                self._spawn(self._say(press.chat_id, answer.text))
        else:
            self._spawn(self._unless_closed(press.task, press.chat_id, answer.text))

    def closed(self, task: str) -> None:
        """Card ``task`` shows its decision now (or was sent one): no note of a press is needed."""
        self._closed[task] = None
        self._trim(self._closed)

    def update_req_id(self, task: str) -> str:
        """The ``req_id`` that may still update card ``task`` (:data:`cards.UPDATE_WINDOW`), or ``""``."""
        at, req_id = self._latest.get(task, (0.0, ""))
        return req_id if req_id and time.monotonic() - at < cards.UPDATE_WINDOW else ""

    def _note(self, press: cards.Press, req_id: str) -> bool:
        if press.msgid:
            if press.msgid in self._seen:
                return False
            self._seen[press.msgid] = None
            self._trim(self._seen)
        if req_id:
            self._latest.pop(press.task, None)
            self._latest[press.task] = (time.monotonic(), req_id)
            self._trim(self._latest)
        return True

    def _may_tell(self, chat_id: str, sender: str) -> bool:
        return self._refusals.allow(f"{chat_id}|{sender}")

    async def _unless_closed(self, task: str, chat_id: str, text: str) -> None:
        await asyncio.sleep(cards.UPDATE_WINDOW + 1.0)
        if task not in self._closed:
            await self._say(chat_id, text)

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await coro
            except (ChannelError, RetryAfter) as exc:
                log.info("wecom: the answer to a press was not sent: %s", exc)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _trim(kept: collections.OrderedDict[str, Any]) -> None:
        while len(kept) > KEPT:
            kept.popitem(last=False)
