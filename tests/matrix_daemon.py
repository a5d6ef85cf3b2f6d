"""What the end-to-end tests of a Matrix daemon share: the users the config allows, the rooms,
the config itself (the fake homeserver and the fake model), and how to wait for a reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config
from tests.fakes.matrix_server import SERVER, FakeMatrix, Seen
from tests.fakes.openai_server import FakeOpenAI

OWNER = f"@owner:{SERVER}"  # allowed by config
FRIEND = f"@friend:{SERVER}"  # allowed too
STRANGER = f"@stranger:{SERVER}"
DM = f"!dm:{SERVER}"
STRANGER_DM = f"!strangerdm:{SERVER}"
GROUP = f"!group:{SERVER}"


def matrix_config(tmp_path: Path, hs: FakeMatrix, model: FakeOpenAI) -> dict[str, Any]:
    hs.room(DM, OWNER)
    hs.room(STRANGER_DM, STRANGER)
    hs.room(GROUP, OWNER, FRIEND)
    cfg = chat_config(tmp_path, model.base_url, hs, allow=[OWNER, f"matrix:{FRIEND}"], group_policy="mention")
    cfg["access"]["pairing"] = True
    return cfg


async def answered(hs: FakeMatrix, event: dict[str, Any], needle: str, timeout: float = 15) -> Seen:
    """Wait until the reply to ``event`` shows ``needle``; return that reply message."""
    room = hs.room_of(event["event_id"])

    def check() -> Seen | None:
        return next((m for m in hs.replies_to(room, event["event_id"]) if needle in m.text), None)

    return await hs.wait_for(check, timeout=timeout, what=f"reply containing {needle!r}")
