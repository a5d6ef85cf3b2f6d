"""Hostile-user attacks on Telegram albums (channels/telegram/albums.py), end to end: ``chital run``
against the wire-level fake Telegram and the fake vision model. What the model got is read from the
fake model's requests; what the user saw from the fake Telegram.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

from PIL import Image

from tests.album_support import USER, album_config, picture
from tests.daemon import started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.telegram_server import FakeTelegram

STRANGER, GROUP = 2002, -100700800
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220)]


def images_in(body: dict[str, Any]) -> int:
    content = body["messages"][-1].get("content")
    return sum(1 for p in content if p.get("type") == "image_url") if isinstance(content, list) else 0


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, album_wait: float = 2.0) -> dict[str, Any]:
    return album_config(tmp_path, model, tg, album_wait)


def answer(body: dict[str, Any]) -> Reply:
    return Reply(text=f"[{last_user_text(body)[-40:]}] with {images_in(body)} picture(s)")


def user_turns(model: FakeOpenAI) -> list[dict[str, Any]]:
    """The model requests that began a turn (their last message is the user's)."""
    return [b for b in model.requests if b["messages"][-1].get("role") == "user"]


async def test_a_message_sent_right_after_an_album_is_answered_after_it(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Order per conversation (class 9, faults at the worst moment: a message in the album's wait).
    The user sends an album and at once a follow-up question and a command. The album is held for
    its wait; the follow-ups must not overtake it: the model gets the album first, then the
    question, and the question's turn sees the album in its history."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        items = [{"photo": tg.add_photo(picture(c))} for c in COLOURS]
        tg.inject_album(USER, USER, items, caption="three shirts")
        tg.inject_message(USER, USER, "which one is cheapest?")
        await tg.wait_for(lambda: len(user_turns(model)) >= 2, timeout=40, what="both turns")
        await asyncio.sleep(3)  # past the album's wait: nothing more comes
        turns = user_turns(model)
        assert len(turns) == 2, [last_user_text(t) for t in turns]
        assert images_in(turns[0]) == 3 and "three shirts" in last_user_text(turns[0]), last_user_text(
            turns[0]
        )
        assert "which one is cheapest?" in last_user_text(turns[1])
        assert "three shirts" in str(turns[1]["messages"][:-1]), "the question's turn sees the album"


def colours_in(body: dict[str, Any]) -> list[tuple[int, int, int]]:
    content = body["messages"][-1].get("content")
    out = []
    for part in content if isinstance(content, list) else []:
        if part.get("type") == "image_url":
            data = base64.b64decode(part["image_url"]["url"].partition(",")[2])
            pixel = Image.open(io.BytesIO(data)).convert("RGB").getpixel((10, 10))
            assert isinstance(pixel, tuple)
            out.append((int(pixel[0]) // 64, int(pixel[1]) // 64, int(pixel[2]) // 64))
    return out


async def test_a_strangers_item_with_the_same_group_id_never_rides_along(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Provenance (class 3) and deny by default: in a group, a stranger forges an item with the
    allowed user's ``media_group_id`` (and mentions the bot) in the middle of the user's album. The
    user's turn gets the user's two pictures only; the stranger's picture never reaches the model."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        group = "55500011122233344"
        kw: dict[str, Any] = {"media_group_id": group}
        tg.inject_mention(GROUP, USER, "compare", photo=tg.add_photo(picture(COLOURS[0])), **kw)
        tg.inject_mention(GROUP, STRANGER, "and mine", photo=tg.add_photo(picture(COLOURS[1])), **kw)
        tg.inject_message(
            GROUP, USER, "", photo=tg.add_photo(picture(COLOURS[2])), chat_type="supergroup", **kw
        )
        await tg.wait_for(lambda: user_turns(model), timeout=40, what="the user's turn")
        await asyncio.sleep(3)  # past the album's wait: nothing more comes
        (turn,) = user_turns(model)
        assert colours_in(turn) == [(3, 0, 0), (0, 0, 3)], colours_in(turn)
        assert "and mine" not in str(model.requests)
        assert len([t for t in tg.bot_texts(GROUP) if "picture(s)" in t]) == 1, tg.bot_texts(GROUP)


async def test_a_kill_while_a_message_waits_behind_an_album_loses_and_doubles_nothing(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Faults at the worst moment (class 9): an album and a message held behind it, kill -9 during
    the album's wait. After the restart: the album, then the message, each answered once."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg, album_wait=4.0)) as daemon:
        polls = len(tg.calls_to("getUpdates"))
        tg.inject_album(USER, USER, [{"photo": tg.add_photo(picture(c))} for c in COLOURS[:2]], caption="two")
        tg.inject_message(USER, USER, "and the price?")
        await tg.wait_for(
            lambda: any(c.params.get("timeout") in (0, "0") for c in tg.calls_to("getUpdates")[polls:]),
            timeout=20,
            what="the daemon gathering the album",
        )
        daemon.kill9()
        await daemon.wait_exit()
        assert user_turns(model) == []
        await daemon.start()
        await tg.wait_for(lambda: len(user_turns(model)) >= 2, timeout=40, what="both turns")
        await asyncio.sleep(5)  # past the album's wait, and a second look
        turns = user_turns(model)
        assert [images_in(t) for t in turns] == [2, 0], [last_user_text(t) for t in turns]
        assert "and the price?" in last_user_text(turns[1])
        assert len([t for t in tg.bot_texts(USER) if "picture(s)" in t]) == 2, tg.bot_texts(USER)
        assert tg.pending_updates == [], "every update confirmed once journaled"
