"""``chital`` one schema version ahead, for the rolling-upgrade tests (tests/test_rolling_upgrade.py).

    python -m tests.upgraded_daemon {additive|breaking} run -c CONFIG

The same code as ``python -m gateway.cli.main``, with one migration step appended to
:data:`gateway.store.schema.MIGRATIONS` before the command runs: a daemon of version N+1 without a
second checkout. Why a launcher here and not a switch in Chital: nothing in the product can add a
step, and the step list is read where it is used (``migrate``, ``known_version``), so appending to
it before the first store opens is all version N+1 is.

- ``additive``: the step only adds a table; older daemons go on writing beside it.
- ``breaking``: the same table, marked ``older_writers=False``: it raises the writer floor, and
  older daemons must stop writing (gateway/store/schema_compat.py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from compat import lean_imports

if TYPE_CHECKING:
    from gateway.store.schema import Migration

PROBE_TABLE = "upgrade_probe"
"""What the N+1 step creates (the tests look for it)."""


def next_step(breaking: bool) -> Migration:
    from gateway.store.connection import Connection
    from gateway.store.schema import MIGRATIONS, Migration

    async def add_probe(db: Connection) -> None:
        await db.execute(
            f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} (name TEXT PRIMARY KEY, made REAL NOT NULL)"
        )

    what = "a probe table (test)" + (": older daemons must not write beside it" if breaking else "")
    return Migration(MIGRATIONS[-1].version + 1, what, add_probe, older_writers=not breaking)


def main() -> int:
    lean_imports.install()  # first, as the real entry point does
    kind = sys.argv.pop(1)
    if kind not in ("additive", "breaking"):
        raise SystemExit(
            f"usage: python -m tests.upgraded_daemon additive|breaking COMMAND ...; not {kind!r}"
        )
    from gateway.store import schema

    schema.MIGRATIONS = (*schema.MIGRATIONS, next_step(kind == "breaking"))
    from gateway.cli.main import main as chital

    return chital()


if __name__ == "__main__":
    raise SystemExit(main())
