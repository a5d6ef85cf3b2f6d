"""Per-user limits the store enforces itself (docs/scale-out.md, "Who owns what").

A limit checked in the process (count the rows, then insert one) holds on one daemon only: two
daemons on one PostgreSQL database can both count 49 of 50 and both insert. So the count is part of
the insert (``INSERT … SELECT … WHERE (SELECT COUNT(*) …) < limit``), run under a lock named after
what is counted (:meth:`gateway.store.connection.Connection.execute_locked`), and a refused insert
raises :class:`OverLimit` with what was counted, for the caller's own words to the user.
"""

from __future__ import annotations


class OverLimit(Exception):
    """An insert the store refused because ``scope`` (``"user"``, ``"conversation"``) already
    has ``count`` rows, its limit or more."""

    def __init__(self, scope: str, count: int) -> None:
        super().__init__(f"{scope} already has {count}")
        self.scope = scope
        self.count = count
