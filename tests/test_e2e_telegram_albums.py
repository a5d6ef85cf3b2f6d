"""Telegram albums (channels/telegram/albums.py, docs/media.md "Telegram albums"), end to end:
``chital run`` with the fake Telegram server sending a media group as the Bot API does (one update
per item, a shared ``media_group_id``) and a vision model; what the model received is read from the
fake model's recorded requests, what the user saw from the fake Telegram.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

from PIL import Image

from channels.base import Attachment, Inbound
from channels.telegram.albums import ALBUM, Albums, group_of
from tests.album_support import USER, album_config, picture
from tests.daemon import started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram

GROUP = -100500600
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 230, 30), (30, 220, 220)]


def colours_seen(content: Any) -> list[tuple[int, int, int]]:
    """The colour of each image part of a model message, in order (decoded from what it got)."""
    seen = []
    for part in content if isinstance(content, list) else []:
        if part.get("type") == "image_url":
            data = base64.b64decode(part["image_url"]["url"].partition(",")[2])
            pixel = Image.open(io.BytesIO(data)).convert("RGB").getpixel((10, 10))
            assert isinstance(pixel, tuple)
            seen.append((int(pixel[0]), int(pixel[1]), int(pixel[2])))
    return seen


def near(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return all(abs(x - y) < 40 for x, y in zip(a, b, strict=True))


def turns_with_images(model: FakeOpenAI) -> list[dict[str, Any]]:
    """The user messages of the model requests that carried images."""
    out = []
    for body in model.requests:
        last = body["messages"][-1]
        if last.get("role") == "user" and colours_seen(last.get("content")):
            out.append(last)
    return out


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, album_wait: float = 1.0) -> dict[str, Any]:
    return album_config(tmp_path, model, tg, album_wait)


def answer(body: dict[str, Any]) -> Reply:
    content = body["messages"][-1].get("content")
    return Reply(text=f"I see {len(colours_seen(content))} picture(s).")


def answers(tg: FakeTelegram, chat: int) -> list[str]:
    return [t for t in tg.bot_texts(chat) if "picture(s)" in t]


async def test_an_album_is_one_turn_with_every_picture_in_order(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        items = [{"photo": tg.add_photo(picture(c))} for c in COLOURS[:4]]
        updates = tg.inject_album(USER, USER, items, caption="what are these?")
        assert len({u["message"]["media_group_id"] for u in updates}) == 1 and len(updates) == 4
        await tg.wait_for(lambda: answers(tg, USER), timeout=30, what="the answer")
        await asyncio.sleep(2.5)  # longer than the album's wait: nothing more comes
        assert answers(tg, USER) == ["I see 4 picture(s)."], tg.bot_texts(USER)
        (turn,) = turns_with_images(model)
        seen = colours_seen(turn["content"])
        assert len(seen) == 4 and all(near(s, c) for s, c in zip(seen, COLOURS, strict=False)), seen
        assert "what are these?" in str(turn["content"])
        (reply,) = [m for m in tg.bot_messages(USER) if "picture(s)" in m.text]
        assert reply.reply_to == updates[0]["message"]["message_id"], "answers the album's first item"


async def test_a_kill_in_the_middle_of_an_album_loses_and_doubles_nothing(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Two items came, the daemon was gathering the album (polling without waiting), kill -9; the
    other three come while it is down. After the restart: one turn with all five, answered once."""
    model.add_rule(lambda _t: True, answer)
    cfg = config(tmp_path, model, tg, album_wait=4.0)
    async with started_daemon(tmp_path, cfg) as daemon:
        group = "13572468013572468"
        photos = [tg.add_photo(picture(c)) for c in COLOURS]
        polls = len(tg.calls_to("getUpdates"))
        for photo in photos[:2]:
            tg.inject_message(USER, USER, "", photo=photo, media_group_id=group)
        await tg.wait_for(
            lambda: any(c.params.get("timeout") in (0, "0") for c in tg.calls_to("getUpdates")[polls:]),
            timeout=20,
            what="the daemon gathering the album",
        )
        daemon.kill9()
        await daemon.wait_exit()
        assert answers(tg, USER) == [] and turns_with_images(model) == []
        for photo in photos[2:]:
            tg.inject_message(USER, USER, "", photo=photo, media_group_id=group)
        await daemon.start()
        await tg.wait_for(lambda: answers(tg, USER), timeout=40, what="the album's answer")
        await asyncio.sleep(5)  # past the album's wait, and a second look
        assert answers(tg, USER) == ["I see 5 picture(s)."], tg.bot_texts(USER)
        (turn,) = turns_with_images(model)
        seen = colours_seen(turn["content"])
        assert len(seen) == 5 and all(near(s, c) for s, c in zip(seen, COLOURS, strict=True)), seen
        assert tg.pending_updates == [], "every member confirmed once journaled"


async def test_a_broken_member_gets_a_note_and_the_rest_go_through_in_a_group(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """In a group the mention is in one item's caption (here the second): the album is addressed.
    One item is a file Telegram will not serve: a note names it, the pictures still reach the model."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        group = "24681357924681357"
        broken = {"file_id": "gone-for-good", "file_unique_id": "gone", "file_name": "report.pdf",
                  "mime_type": "application/pdf", "file_size": 1234}  # fmt: skip
        tg.inject_message(GROUP, USER, "", photo=tg.add_photo(picture(COLOURS[0])), media_group_id=group,
                          chat_type="supergroup")  # fmt: skip
        tg.inject_mention(GROUP, USER, "compare these", document=broken, media_group_id=group)
        tg.inject_message(GROUP, USER, "", photo=tg.add_photo(picture(COLOURS[2])), media_group_id=group,
                          chat_type="supergroup")  # fmt: skip
        reply = await tg.wait_for(lambda: answers(tg, GROUP), timeout=30, what="the answer")
        await asyncio.sleep(2.5)
        (text,) = answers(tg, GROUP)
        assert "I could not fetch" in text and "report.pdf" in text and text.endswith("I see 2 picture(s).")
        assert reply
        (turn,) = turns_with_images(model)
        seen = colours_seen(turn["content"])
        assert len(seen) == 2 and near(seen[0], COLOURS[0]) and near(seen[1], COLOURS[2]), seen
        assert "compare these" in str(turn["content"])


async def test_an_album_member_that_cannot_be_read_gets_a_note_and_the_rest_one_turn(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The second of three items is an update PTB cannot parse (a date that is words): it is
    skipped with the usual note, and the first and third still reach the model as one album."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        group = "97531086421097531"
        tg.inject_message(USER, USER, "look", photo=tg.add_photo(picture(COLOURS[0])), media_group_id=group)
        tg.inject_malformed(USER, USER, "", override={"date": "secret words", "media_group_id": group,
                                                      "photo": tg.add_photo(picture(COLOURS[1]))})  # fmt: skip
        tg.inject_message(USER, USER, "", photo=tg.add_photo(picture(COLOURS[2])), media_group_id=group)
        await tg.wait_for(lambda: answers(tg, USER), timeout=30, what="the answer")
        await tg.wait_for(
            lambda: [t for t in tg.bot_texts(USER) if "couldn't read that message" in t],
            timeout=30,
            what="note",
        )
        await asyncio.sleep(2.5)
        assert answers(tg, USER) == ["I see 2 picture(s)."], tg.bot_texts(USER)
        (turn,) = turns_with_images(model)
        seen = colours_seen(turn["content"])
        assert len(seen) == 2 and near(seen[0], COLOURS[0]) and near(seen[1], COLOURS[2]), seen
        assert "secret words" not in str(model.requests)
        assert tg.pending_updates == []


# -- the bounds, in process (channels/telegram/albums.py) ----------------------------------------------
def member(message_id: int, text: str = "", addressed: bool = False) -> Inbound:
    att = Attachment(f"f{message_id}", f"photo_{message_id}.jpg", "image/jpeg", 10, kind="image")
    return Inbound("telegram", "-1", str(message_id), "7", text, False, addressed, attachments=(att,))


def test_unusable_group_ids_make_separate_messages() -> None:
    for bad in (123, "", "x" * 65, "12\n34", None, ["1"]):
        assert group_of({"update_id": 1, "message": {"media_group_id": bad}}) is None, bad
    assert group_of({"update_id": 1, "message": {"media_group_id": "1357"}}) == "1357"
    assert group_of({"update_id": 1, "message": None}) is None


def test_a_forged_album_of_twelve_is_two_and_a_trickle_ends_at_the_max_wait() -> None:
    albums = Albums(quiet=1.0, max_wait=10.0)
    for i in range(12):
        albums.add(100 + i, member(500 + i, "cap" if i == 5 else "", addressed=i == 5), "g", now=0.0)
    assert albums.held_from() == 100
    (first,) = albums.due(now=0.1)  # the full one at once; the other two wait for quiet
    assert first[1] == list(range(100, 110))
    assert [a.name for a in first[2].attachments] == [f"photo_{500 + i}.jpg" for i in range(10)]
    assert first[2].message_id == "500" and first[2].addressed and first[2].text == "cap"
    assert first[2].extra[ALBUM]["members"] == [str(500 + i) for i in range(10)]
    albums.done(first[0])
    assert albums.held_from() == 110
    (rest,) = albums.due(now=1.5)
    assert rest[1] == [110, 111] and not rest[2].addressed
    albums.done(rest[0])
    assert not albums and albums.held_from() is None

    trickle = Albums(quiet=3.0, max_wait=10.0)  # a member every 2 s: never 3 s of quiet
    t = 0.0
    while not trickle.due(now=t):
        trickle.add(int(t) + 1, member(int(t) + 1), "slow", now=t)
        t += 2.0
        assert t <= 12.0
    assert t == 10.0 and len(trickle.due(now=t)[0][1]) == 5, "handed over at the max wait"
