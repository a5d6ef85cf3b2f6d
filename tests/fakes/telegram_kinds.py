"""Bot API payloads of the message kinds that are not text, for :meth:`FakeTelegram.inject_content`.

Shapes as Telegram sends them today (Bot API 10: a poll has ``allows_revoting`` and ``members_only``,
its options a ``persistent_id``), plus the old poll shape PTB 22.8 can no longer parse.
"""

from __future__ import annotations

from typing import Any


def sticker(emoji: str = "😀") -> dict[str, Any]:
    return {"sticker": {"file_id": "STK1", "file_unique_id": "UST1", "width": 512, "height": 512,
                        "is_animated": False, "is_video": False, "type": "regular", "emoji": emoji}}  # fmt: skip


def location(lat: float = 52.52, lon: float = 13.405) -> dict[str, Any]:
    return {"location": {"latitude": lat, "longitude": lon}}


def venue(title: str = "Cafe Einstein", address: str = "Kurfürstenstraße 58") -> dict[str, Any]:
    loc = {"latitude": 52.5, "longitude": 13.35}
    return {"location": loc, "venue": {"location": loc, "title": title, "address": address}}


def contact(first: str = "Ada", last: str = "Lovelace", phone: str = "+441234567") -> dict[str, Any]:
    return {"contact": {"phone_number": phone, "first_name": first, "last_name": last}}


def poll(question: str = "Lunch?", options: tuple[str, ...] = ("pizza", "sushi")) -> dict[str, Any]:
    return {"poll": {"id": "P1", "question": question, "total_voter_count": 0, "is_closed": False,
                     "is_anonymous": True, "type": "regular", "allows_multiple_answers": False,
                     "allows_revoting": False, "members_only": False,
                     "options": [{"text": o, "voter_count": 0, "persistent_id": f"o{i}"}
                                 for i, o in enumerate(options)]}}  # fmt: skip


def old_poll(question: str = "Old shape?") -> dict[str, Any]:
    """A poll as Bot API < 9.6 sent it: no ``allows_revoting``, options without ``persistent_id``
    (PTB 22.8 refuses it)."""
    body = poll(question)
    del body["poll"]["allows_revoting"], body["poll"]["members_only"]
    for option in body["poll"]["options"]:
        del option["persistent_id"]
    return body


def dice(value: int = 4, emoji: str = "🎲") -> dict[str, Any]:
    return {"dice": {"emoji": emoji, "value": value}}


def video_note(file_id: str, unique_id: str = "UVN1", size: int = 10) -> dict[str, Any]:
    return {"video_note": {"file_id": file_id, "file_unique_id": unique_id, "length": 240, "duration": 3,
                           "file_size": size}}  # fmt: skip


def voice(file_id: str, unique_id: str = "UVO1", size: int = 10) -> dict[str, Any]:
    return {"voice": {"file_id": file_id, "file_unique_id": unique_id, "duration": 2, "mime_type": "audio/ogg",
                      "file_size": size}}  # fmt: skip


def game(title: str = "Tetris") -> dict[str, Any]:
    photo = [{"file_id": "G1", "file_unique_id": "UG1", "width": 10, "height": 10}]
    return {"game": {"title": title, "description": "blocks", "photo": photo}}
