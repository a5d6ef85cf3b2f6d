"""Per-user limits the store enforces itself (docs/scale-out.md, "Who owns what").

A limit checked in the process (count the rows, then insert one) holds on one daemon only: two
daemons on one PostgreSQL database can both count 49 of 50 and both insert. So the count is part of
the insert (``INSERT … SELECT … WHERE (SELECT COUNT(*) …) < limit``), run under a lock named after
what is counted (:meth:`gateway.store.connection.Connection.execute_locked`), and a refused insert
raises :class:`OverLimit` with what was counted, for the caller's own words to the user.

Why a lock on PostgreSQL: under READ COMMITTED a statement reads a snapshot taken when it starts,
so two daemons' ``INSERT … WHERE (SELECT COUNT(*) …) < limit`` would both count the same rows and
both insert. Behind a transaction-scoped advisory lock, the statement's snapshot is taken once the
lock is held and shows every row the previous holder committed. The lock and the statement go in
one round trip of several statements (the simple query protocol runs them as one implicit
transaction), not through ``transaction()``: the store's connection is shared by the daemon's
tasks, whose statements would otherwise run inside the open transaction. Locks are taken in one
order (sorted names), so two such statements never wait for each other in a circle. SQLite needs no
lock: it has one writer at a time, and a write statement reads under the write lock.
"""

from __future__ import annotations


class OverLimit(Exception):
    """An insert the store refused because ``scope`` (``"user"``, ``"conversation"``) already
    has ``count`` rows, its limit or more."""

    def __init__(self, scope: str, count: int) -> None:
        super().__init__(f"{scope} already has {count}")
        self.scope = scope
        self.count = count
