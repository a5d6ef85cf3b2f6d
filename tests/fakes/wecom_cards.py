"""The fake WeCom long connection's proactive messages, template cards and media upload (mixed into
:class:`tests.fakes.wecom_server.FakeWeCom`), as WeCom's Node SDK sends and reads them
(docs/setup/wecom.md section 8).

* ``aibot_send_msg``: ``chatid`` and one of ``markdown`` (``content``), ``template_card`` (a
  ``button_interaction`` card: ``task_id`` of ``[A-Za-z0-9_-@]`` up to 128 bytes, unique per
  robot, 1 to 6 buttons each with ``text`` and a ``key`` up to 1,024 bytes, keys distinct), or
  ``file`` / ``image`` naming a ``media_id`` this fake's upload made. Bad input: errcode 40008.
* a press (:meth:`inject_press`): ``aibot_event_callback`` with ``template_card_event``; its
  ``req_id`` takes one ``aibot_respond_update_msg`` (``response_type: update_template_card``,
  the card's ``task_id``) within :attr:`update_window` seconds (846608 after, 846605 for a
  ``req_id`` that is no card event: these two codes are the stream's, the real ones for a card
  were not found).
* ``aibot_upload_media_init`` -> ``body.upload_id``; ``aibot_upload_media_chunk`` (``chunk_index``
  from 0, base64 of at most 512 KiB); ``aibot_upload_media_finish`` -> ``body.media_id`` once every
  chunk came and the size and md5 match. :attr:`fail_upload` makes one step answer an errcode.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.wecom_server import Shown

UPLOAD_CMDS = ("aibot_upload_media_init", "aibot_upload_media_chunk", "aibot_upload_media_finish")
TASK = re.compile(r"\A[A-Za-z0-9_\-@]{1,128}\Z")
CHUNK = 512 * 1024
_ids = itertools.count(1)


class WeComCardsMixin:
    messages: list[Shown]
    bot_id: str
    _cards: dict[str, Shown]
    _card_events: dict[str, tuple[float, str]]
    update_window: float
    _uploads: dict[str, dict[str, Any]]
    uploaded: dict[str, tuple[bytes, str, str]]
    fail_upload: tuple[str, int] | None

    def _push(self, frame: dict[str, Any] | str) -> None:
        raise NotImplementedError

    def _send(self, body: dict[str, Any], frame: dict[str, Any]) -> tuple[int, str]:
        from tests.fakes.wecom_server import Shown

        chat, kind = body.get("chatid"), body.get("msgtype")
        if not isinstance(chat, str) or not chat:
            return 40008, "invalid chatid"
        if kind == "markdown":
            content = (body.get("markdown") or {}).get("content")
            if not isinstance(content, str):
                return 40008, "invalid message"
            self.messages.append(Shown(chat, content, "markdown", finished=True, frames=[frame]))
        elif kind == "template_card":
            card = body.get("template_card")
            problem = _card_problem(card)
            if problem:
                return 40008, problem
            assert isinstance(card, dict)
            if card["task_id"] in self._cards:
                return 40058, "task_id exists"  # a code of this fake's: the real one was not found
            shown = Shown(chat, _card_text(card), "card", finished=True, frames=[frame], card=card)
            self._cards[card["task_id"]] = shown
            self.messages.append(shown)
        elif kind in ("file", "image"):
            media_id = (body.get(kind) or {}).get("media_id")
            found = self.uploaded.get(media_id) if isinstance(media_id, str) else None
            if found is None or found[2] != kind:
                return 40007, "invalid media_id"
            self.messages.append(Shown(chat, found[1], kind, finished=True, frames=[frame], media=found[0]))
        else:
            return 40008, "invalid msgtype"
        return 0, "ok"

    def inject_press(self, user: str, card: Shown, key: str, *, group: str = "", task_id: str = "") -> str:
        """``user`` presses the button ``key`` of ``card`` (in ``group``, else their 1:1 chat);
        returns the event's ``req_id``."""
        req_id = f"evreq_{next(_ids)}_{time.monotonic_ns()}"
        task = task_id or card.card.get("task_id", "")
        body: dict[str, Any] = {
            "msgid": f"ev{next(_ids)}x{time.monotonic_ns()}", "create_time": int(time.time()),
            "aibotid": self.bot_id, "chattype": "group" if group else "single", "from": {"userid": user},
            "msgtype": "event", "event": {"eventtype": "template_card_event", "event_key": key, "task_id": task},
        }  # fmt: skip
        if group:
            body["chatid"] = group
        self._card_events[req_id] = (time.monotonic(), task)
        self._push({"cmd": "aibot_event_callback", "headers": {"req_id": req_id}, "body": body})
        return req_id

    def _update(self, req_id: Any, body: dict[str, Any], frame: dict[str, Any]) -> tuple[int, str]:
        event = self._card_events.get(req_id) if isinstance(req_id, str) else None
        if event is None:
            return 846605, "invalid req_id"
        if time.monotonic() - event[0] > self.update_window:
            return 846608, "update expired"
        card = body.get("template_card")
        if body.get("response_type") != "update_template_card" or not isinstance(card, dict):
            return 40008, "invalid message"
        if card.get("task_id") != event[1] or event[1] not in self._cards:
            return 40008, "task_id mismatch"
        shown = self._cards[event[1]]
        shown.card, shown.content = card, _card_text(card)
        shown.updates += 1
        shown.frames.append(frame)
        del self._card_events[req_id]  # one update per event
        return 0, "ok"

    def _upload(self, cmd: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
        if self.fail_upload and self.fail_upload[0] == cmd:
            code, self.fail_upload = self.fail_upload[1], None
            return code, "upload refused", None
        if cmd == UPLOAD_CMDS[0]:
            size, total, name = body.get("total_size"), body.get("total_chunks"), body.get("filename")
            if (body.get("type") not in ("file", "image", "voice", "video") or not isinstance(name, str)
                    or not name or not isinstance(size, int) or not isinstance(total, int)
                    or not 1 <= total <= 100 or total != -(-size // CHUNK)):  # fmt: skip
                return 40008, "invalid upload", None
            upload_id = f"up{next(_ids)}"
            self._uploads[upload_id] = {**body, "chunks": {}}
            return 0, "ok", {"upload_id": upload_id}
        upload = self._uploads.get(body.get("upload_id"))  # type: ignore[arg-type]
        if upload is None:
            return 40008, "invalid upload_id", None
        if cmd == UPLOAD_CMDS[1]:
            index = body.get("chunk_index")
            try:
                data = base64.b64decode(body.get("base64_data") or "", validate=True)
            except (binascii.Error, ValueError):
                return 40008, "invalid base64_data", None
            if not isinstance(index, int) or not 0 <= index < upload["total_chunks"] or len(data) > CHUNK:
                return 40008, "invalid chunk", None
            upload["chunks"][index] = data
            return 0, "ok", None
        data = b"".join(upload["chunks"].get(i, b"") for i in range(upload["total_chunks"]))
        if len(upload["chunks"]) != upload["total_chunks"] or len(data) != upload["total_size"]:
            return 40008, "chunks missing", None
        if upload.get("md5") and hashlib.md5(data).hexdigest() != upload["md5"]:
            return 40008, "md5 mismatch", None
        media_id = f"media{next(_ids)}"
        self.uploaded[media_id] = (data, upload["filename"], upload["type"])
        del self._uploads[body["upload_id"]]
        return 0, "ok", {"type": upload["type"], "media_id": media_id, "created_at": str(int(time.time()))}

    def cards_in(self, chat: str) -> list[Shown]:
        return [m for m in self.messages if m.chat == chat and m.kind == "card"]


def _card_problem(card: Any) -> str:
    if not isinstance(card, dict) or card.get("card_type") != "button_interaction":
        return "invalid card_type"
    task = card.get("task_id")
    if not isinstance(task, str) or not TASK.match(task) or len(task.encode()) > 128:
        return "invalid task_id"
    buttons = card.get("button_list")
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= 6:
        return "invalid button_list"
    keys = [b.get("key") if isinstance(b, dict) else None for b in buttons]
    if any(not isinstance(k, str) or not k or len(k.encode()) > 1024 for k in keys) or len(set(keys)) != len(
        keys
    ):
        return "invalid button key"
    if any(not isinstance(b.get("text"), str) or not b["text"] for b in buttons):
        return "invalid button text"
    return ""


def _card_text(card: dict[str, Any]) -> str:
    """What a user reads on a card: its title, its second line, its buttons' texts."""
    lines = [(card.get("main_title") or {}).get("title", ""), card.get("sub_title_text", "")]
    lines += [f"[{b['text']}]" for b in card.get("button_list") or []]
    return "\n".join(line for line in lines if line)
