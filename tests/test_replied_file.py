"""The replied-to file an adapter records for ``/skills install`` sent as a reply
(channels/messages.py ``REPLIED_FILE``): read back from the journal, so every shape it was not
written in (wrong types, missing ids, a bot as sender, oversized values) gives nothing usable or
a bounded, checked value, never an exception or a file id that is not a string."""

from __future__ import annotations

from typing import Any

import pytest

from channels.base import REPLIED_FILE, Attachment, Inbound, replied_file, replied_file_extra


def inbound(extra: dict[str, Any]) -> Inbound:
    return Inbound("telegram", "1", "2", "3", "/skills install", True, True, extra=extra)


def test_round_trip_keeps_the_file_and_its_sender() -> None:
    extra = replied_file_extra(Attachment("F1", "a.zip", "application/zip", 10), "telegram:9", from_bot=False)
    found = replied_file(inbound(extra))
    assert found == (Attachment("F1", "a.zip", "application/zip", 10), "telegram:9")


def test_a_file_a_bot_sent_is_marked() -> None:
    extra = replied_file_extra(Attachment("F1", "a.zip"), "telegram:7000001", from_bot=True)
    assert replied_file(inbound(extra)) == (Attachment("F1", "a.zip"), "bot")


@pytest.mark.parametrize(
    "data",
    [
        None,
        "F1",
        [],
        {},
        {"file_id": 7, "name": "a.zip"},
        {"file_id": "", "name": "a"},
        {"file_id": "F", "name": 3},
    ],
)
def test_shapes_it_was_not_written_in_give_nothing(data: Any) -> None:
    assert replied_file(inbound({REPLIED_FILE: data})) is None


def test_wrong_typed_details_are_dropped_and_an_unknown_sender_counts_as_a_bot() -> None:
    data = {"file_id": "F", "name": "a.zip", "size": "huge", "mime": 5, "sender": ["x"]}
    assert replied_file(inbound({REPLIED_FILE: data})) == (Attachment("F", "a.zip"), "bot")
    negative = {"file_id": "F", "name": "a.zip", "size": -1, "bot": False, "sender": "telegram:1"}
    assert replied_file(inbound({REPLIED_FILE: negative})) == (Attachment("F", "a.zip"), "telegram:1")
    bools = {"file_id": "F", "name": "a.zip", "size": True, "bot": False}
    assert replied_file(inbound({REPLIED_FILE: bools})) == (Attachment("F", "a.zip"), "")


def test_recorded_values_are_bounded() -> None:
    extra = replied_file_extra(Attachment("F" * 5000, "n" * 5000), "s" * 5000, from_bot=False)
    att, sender = replied_file(inbound(extra)) or (None, "")
    assert att is not None and len(att.file_id) <= 512 and len(att.name) <= 255 and len(sender) <= 100
