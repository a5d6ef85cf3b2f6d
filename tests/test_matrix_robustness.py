"""Matrix field reliability, through matrix-nio against FakeMatrix with the real gateway (journal,
notices, metrics) and an echo harness: every malformed timeline event is skipped and counted, never
stops the sync, is logged without its text, and its sender is told where the event still names
them; the messages around it are answered."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from channels.base import ChannelState
from channels.matrix.channel import MatrixChannel
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.matrix_server import SERVER, FakeMatrix

ALICE = f"@alice:{SERVER}"
ROOM = f"!dm:{SERVER}"


@pytest.fixture
def allowed_users() -> list[str]:
    return [ALICE]


IDS = ("missing", "null", "number", "object", "list", "huge id", "control chars")
VALUES = ("missing", "null", "number", "object", "list", "huge list", "nested nulls")
TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {
    ("event_id",): (IDS, False),
    ("sender",): ((*IDS, "string"), False),  # "secret words" is no user id
    ("type",): (("missing", "null", "number", "object"), True),
    ("content",): (("missing", "null", "number", "string", "list"), True),
    ("content", "body"): (VALUES, True),
    ("content", "msgtype"): (("missing", "null", "number", "object", "list"), True),
    ("content", "m.relates_to"): (("number", "string", "list"), True),
}


def good_event(hs: FakeMatrix) -> dict[str, Any]:
    return hs.event(ALICE, {"msgtype": "m.text", "body": SECRET})


def texts(hs: FakeMatrix, needle: str) -> list[str]:
    return [m.text for m in hs.bot_messages(ROOM) if needle in m.text]


@pytest.mark.parametrize("case", variants(TABLE), ids=lambda c: c.id)
async def test_malformed_event_is_skipped_counted_and_told(
    case: Case, matrix_hs: FakeMatrix, adapter_rig: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    matrix_hs.room(ROOM, ALICE)
    channel = MatrixChannel(matrix_hs.base_url, matrix_hs.user_id, matrix_hs.token, sync_timeout=1,
                            state_dir=str(tmp_path))  # fmt: skip
    async with running(channel, adapter_rig):
        await matrix_hs.wait_for(lambda: matrix_hs.syncs >= 2, what="the first long poll")
        matrix_hs.inject_text(ROOM, ALICE, "first good one")
        matrix_hs.inject_event(ROOM, put(good_event(matrix_hs), case.path, case.value))
        matrix_hs.inject_text(ROOM, ALICE, "second good one")
        await matrix_hs.wait_for(lambda: texts(matrix_hs, "echo: second good one"), what="second answered")
        assert texts(matrix_hs, "echo: first good one")
        if case.told:
            await matrix_hs.wait_for(lambda: texts(matrix_hs, "couldn't read that message"), what="the note")
        assert channel.state is ChannelState.CONNECTED
    assert channel.unreadable_events == 1
    assert malformed_total(adapter_rig, "matrix") == 1
    assert len(texts(matrix_hs, "couldn't read")) == (1 if case.told else 0)
    assert not leaked(caplog.records), "the event's text reached a log line"
    assert all(SECRET not in m.text for m in matrix_hs.bot_messages(ROOM))
