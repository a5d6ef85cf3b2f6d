"""The web chat's room in the database (gateway/store/webchat.py), on SQLite and PostgreSQL, with two
connections as two daemons have: every write raises the chat's ``seq`` (an edit too) and two
writers never share one, so a page asking "after N" misses nothing; a repeated message id or send
key adds nothing; a file is found only under its own chat; old messages and files are pruned."""

from __future__ import annotations

import asyncio

from channels.base import Button
from channels.web.room import FileRef
from gateway.store.journal import Store

CHAT = "admin~0123456789ab"
OTHER = "admin~ba9876543210"


async def test_seq_grows_on_every_write_across_connections(two_stores: tuple[Store, Store]) -> None:
    a, b = two_stores
    writes = [
        (a if i % 2 else b).web_add(CHAT, "admin", f"b-{i}", "bot", "", f"part {i}", send_key=f"k{i}")
        for i in range(20)
    ]
    await asyncio.gather(*writes)
    rows = await a.web_since(CHAT, 0, 100)
    assert sorted(m.seq for m in rows) == list(range(1, 21)), [m.seq for m in rows]
    top = max(m.seq for m in rows)
    assert await b.web_edit(CHAT, "b-3", "edited", (Button("OK", "v"),))
    changed = await a.web_since(CHAT, top, 100)
    assert [(m.msg_id, m.text, m.seq) for m in changed] == [("b-3", "edited", top + 1)]
    assert changed[0].buttons == (Button("OK", "v", ""),)
    assert not await a.web_edit(OTHER, "b-3", "not here", None), "an edit names its chat"


async def test_repeats_add_nothing(two_stores: tuple[Store, Store]) -> None:
    a, b = two_stores
    first = await a.web_add(CHAT, "admin", "b-1", "bot", "", "hi", send_key="key")
    again = await b.web_add(CHAT, "admin", "b-2", "bot", "", "hi", send_key="key")
    assert first == again == "b-1" and await a.web_by_key("key") == "b-1"
    await a.web_add(CHAT, "admin", "u-n", "user", "admin", "hello")
    await b.web_add(CHAT, "admin", "u-n", "user", "admin", "hello (a double click)")
    texts = [m.text for m in await a.web_since(CHAT, 0, 100)]
    assert texts == ["hi", "hello"], texts


async def test_files_belong_to_their_chat_and_old_ones_are_pruned(two_stores: tuple[Store, Store]) -> None:
    a, b = two_stores
    await a.web_file_put(CHAT, "f-0", "r.txt", "text/plain", b"\x00report")
    await a.web_add(CHAT, "admin", "u-1", "user", "admin", "", files=(FileRef("f-0", "r.txt", 7),))
    found = await b.web_file_get(CHAT, "f-0")
    assert found is not None and found.data == b"\x00report" and found.name == "r.txt"
    assert await b.web_file_get(OTHER, "f-0") is None
    (message,) = await b.web_since(CHAT, 0, 10)
    assert message.files == (FileRef("f-0", "r.txt", 7),)
    chats = await b.web_chats("admin", 10)
    assert [c.chat_id for c in chats] == [CHAT] and await b.web_chats("bob", 10) == []
    assert await a.web_prune(3600) == 0, "nothing is an hour old"
    assert await a.web_prune(0) == 1
    assert await b.web_since(CHAT, 0, 10) == [] and await b.web_file_get(CHAT, "f-0") is None


async def test_a_nul_is_stored_on_both_engines(two_stores: tuple[Store, Store]) -> None:
    """A NUL a person typed or the model wrote: PostgreSQL's text columns refuse it, so the room
    stores U+FFFD in its place on both engines (a write failing on one engine only is a 500 there)."""
    a, b = two_stores
    await a.web_file_put(CHAT, "f-0", "a\x00b.txt", "text/\x00plain", b"\x00data")
    await a.web_add(CHAT, "admin", "u-1", "user", "admin\x00", "nul\x00here", buttons=(Button("a\x00", "v"),))
    assert await b.web_edit(CHAT, "u-1", "edited\x00", None)
    (message,) = await b.web_since(CHAT, 0, 10)
    assert message.text == "edited\ufffd" and message.author == "admin\ufffd"
    assert message.buttons == (Button("a\x00", "v", ""),), "JSON columns keep it, escaped"
    found = await b.web_file_get(CHAT, "f-0")
    assert found is not None and found.name == "a\ufffdb.txt" and found.data == b"\x00data"
