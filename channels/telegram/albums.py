"""Telegram albums (media groups): several photos or files sent together arrive as ONE message.

The Bot API sends an album as separate ``message`` updates that share a ``media_group_id``, with
the caption (if any) on one of them and no count of how many there are. Handing each to the
gateway would make an album of five photos five turns. So the adapter holds an album's members
and hands the gateway one :class:`~channels.base.Inbound`: the first member's ids (its key and
reply target), every member's files in message order, their captions joined, addressed when any
member is (in a group the mention is in the caption of one member only).

Durable like a single message (docs/durability.md): the long poll's offset is a watermark, so
while an album is open the adapter does not confirm its first update nor anything after it. The
album is journaled as one message first; only then does the offset move past its members. A
daemon killed in the middle of an album confirmed none of it: Telegram serves every member again
after the restart, and the album is gathered again, whole. Updates after an open album are handed
over at once (other chats are not held up) and skipped when the poll serves them again; after a
crash they come again and the journal drops the duplicates.

Bounds (docs/media.md, "Telegram albums"):

- an album is handed over once no new member came for ``quiet`` seconds (``album_wait``, 1 s by
  default: a client sends an album's messages in one request, so its updates come within
  milliseconds of each other), or ``max_wait`` seconds after its first member, whichever is first;
- at most :data:`MAX_MEMBERS` (10, Telegram's own limit) members: a forged "album" of more is cut
  into albums of ten;
- an album stays open (holding the offset) until the gateway accepted it: a failed hand-over is
  tried again at the next look, never dropped;
- a message of the same conversation (chat and topic) that comes while an album is open there is
  held behind it (:meth:`Albums.behind`) and handed over after it: "which one is cheapest?" sent
  right after three photos must not be answered before the photos were seen. It holds the offset
  like a member, so a kill -9 loses it no more than the album;
- a member that comes after its album was handed over (later than the wait) becomes a message of
  its own; a member that never comes is simply not there;
- a ``media_group_id`` that is not a short string is ignored (the member is a message of its own);
- a member Telegram cannot give us later (a download that fails) costs that file only: the turn
  gets a note for it and the other files (gateway/intake/attachments.py). A member whose update
  cannot be parsed is skipped with a note like any unreadable update.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from channels.base import Inbound

MAX_MEMBERS = 10
"""Telegram's limit on an album's items."""
MAX_GROUP_ID = 64
"""Characters of a ``media_group_id`` we accept (Telegram's are ~18 digits)."""
QUIET = 1.0
"""Seconds without a new member after which an album is complete."""
MAX_WAIT = 10.0
"""Seconds after its first member by which an album is handed over, whatever still comes."""
ALBUM_POLL = 0.25
"""Seconds between two looks while an album is being gathered (the poll does not wait then)."""
ALBUM = "album"
"""In the handed-over Inbound's ``extra``: the group id and the members' message ids, in order."""

_Key = tuple[str, str, str, str, int]
_Conversation = tuple[str, str]


def _conversation(inbound: Inbound) -> _Conversation:
    return (inbound.chat_id, inbound.thread_id or "")


def group_of(raw: Any) -> str | None:
    """The ``media_group_id`` of a raw ``message`` update, when it is a usable one."""
    msg = raw.get("message") if isinstance(raw, dict) else None
    group = msg.get("media_group_id") if isinstance(msg, dict) else None
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_ID or not group.isprintable():
        return None
    return group


@dataclass(slots=True)
class _Album:
    group: str
    started: float
    last: float
    members: dict[int, Inbound] = field(default_factory=dict)
    """By update id."""


class Albums:
    """The open albums of one poller, and which updates they hold back from confirmation."""

    def __init__(self, quiet: float = QUIET, max_wait: float = MAX_WAIT) -> None:
        self.quiet = quiet
        self.max_wait = max(max_wait, quiet)
        self._open: dict[_Key, _Album] = {}
        self._after: dict[int, Inbound] = {}
        """Messages held behind an open album of their conversation, by update id."""
        self._handled: set[int] = set()
        """Update ids at or after an open album's first that were handled already: the poll serves
        them again (the offset is held back) and they are skipped."""

    def __bool__(self) -> bool:
        return bool(self._open or self._after)

    def behind(self, update_id: Any, inbound: Inbound) -> bool:
        """Hold ``inbound`` (not an album member) when an album of its conversation opened before
        it: it is handed over after that album, in update order (True: held)."""
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            return False
        if not self._earlier(_conversation(inbound), update_id):
            return False
        self._after[update_id] = inbound
        return True

    def _earlier(self, conversation: _Conversation, update_id: int) -> bool:
        """Whether an album of ``conversation`` that began before ``update_id`` is still open."""
        return any(k[:2] == conversation and min(a.members) < update_id for k, a in self._open.items())

    def add(self, update_id: int, inbound: Inbound, group: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        base = (inbound.chat_id, inbound.thread_id or "", inbound.sender_id, group)
        part = 0
        while True:  # a full album (a forged one of more than ten) goes on in a new one
            album = self._open.get((*base, part))
            if album is None or update_id in album.members or len(album.members) < MAX_MEMBERS:
                break
            part += 1
        if album is None:
            album = self._open[(*base, part)] = _Album(group, now, now)
        album.members[update_id] = inbound
        album.last = now

    def held_from(self) -> int | None:
        """The lowest update id an open album holds (the offset may not move past it)."""
        firsts = [min(a.members) for a in self._open.values()] + list(self._after)
        return min(firsts, default=None)

    def due(self, now: float | None = None) -> list[tuple[_Key, list[int], Inbound]]:
        """The albums that are complete, each as (its key for :meth:`done`, its update ids, the
        one message). They stay open (holding the offset) until :meth:`done` says they were
        handed over."""
        now = time.monotonic() if now is None else now
        out: list[tuple[_Key, list[int], Inbound]] = []
        for key, album in self._open.items():
            full = len(album.members) >= MAX_MEMBERS
            if full or now - album.last >= self.quiet or now - album.started >= self.max_wait:
                uids = sorted(album.members)
                out.append((key, uids, merge(album.group, [album.members[u] for u in uids])))
        return sorted(out, key=lambda item: item[1][0])

    def done(self, key: _Key) -> None:
        """The album was handed over (journaled): it holds nothing back any more."""
        self._open.pop(key, None)

    def handled(self, update_id: Any) -> bool:
        return isinstance(update_id, int) and update_id in self._handled

    def mark(self, update_id: int) -> None:
        """``update_id`` was handled (or is held in an album): skip it when it is served again."""
        if self._open:
            self._handled.add(update_id)

    async def hand_over_due(self, hand_over: Callable[[Inbound, str], Awaitable[None]]) -> None:
        """Hand each complete album and each message held behind one over, in update order, once
        no earlier album of its conversation is still open (``hand_over`` returns once it is
        journaled), then let it go; one that fails stays and holds the offset, and the exception
        propagates."""
        due = {uids[0]: (key, uids, album) for key, uids, album in self.due()}
        for uid in sorted([*due, *self._after]):
            if uid in due:
                key, uids, album = due[uid]
                if self._earlier(key[:2], uid):
                    continue
                await hand_over(album, f"album of updates {uids[0]}-{uids[-1]}")
                self.done(key)
            elif not self._earlier(_conversation(self._after[uid]), uid):
                await hand_over(self._after[uid], f"update {uid}")
                del self._after[uid]
        held = self.held_from()
        self._handled = {u for u in self._handled if held is not None and u >= held}

    def wait(self, now: float | None = None) -> float:
        """Seconds until the next album may be due (0 when one is)."""
        now = time.monotonic() if now is None else now
        ends = [min(a.last + self.quiet, a.started + self.max_wait) for a in self._open.values()]
        if self._after and not self._open:
            return 0.0  # held messages whose album went, but whose hand-over failed: now
        return max(0.0, min(ends, default=0.0) - now)


def merge(group: str, members: list[Inbound]) -> Inbound:
    """One message of an album's members: the first's ids, every file in message order, the
    captions joined, addressed when any member is."""
    ordered = sorted(members, key=lambda m: (len(m.message_id), m.message_id))
    head = ordered[0]
    extra: dict[str, Any] = {}
    for member in ordered:
        for name, value in member.extra.items():
            extra.setdefault(name, value)
    extra[ALBUM] = {"id": group, "members": [m.message_id for m in ordered]}
    return replace(
        head,
        text="\n\n".join(m.text for m in ordered if m.text.strip()),
        attachments=tuple(a for m in ordered for a in m.attachments),
        addressed=any(m.addressed for m in ordered),
        extra=extra,
    )
