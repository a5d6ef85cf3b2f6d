"""Host identities of sandboxes: which uid owns a thread, and whether that uid can reach its dirs.

Why a module: both providers need the same two answers, and getting either wrong broke real
deployments. The start-up check once demanded *read* permission on a root that
``ThreadDirs.ensure`` itself had made search-only (0711), so every restart after the first ran
without a sandbox, with advice (``o+x`` on the parents) that did not fix it. Here the check asks
for exactly what is needed (search, ``x``, on every directory down to the root; read as well on
the skills dir, which sandboxed code lists) and names the directory that blocks and the command
that fixes it.

``UidPool`` is the opt-in (``uid_range``) host uid per thread; see docs/sandbox.md.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .paths import SandboxError, ThreadDirs, shared_dir_mode


def traversal_problem(path: Path, uid: int, gid: int, *, read: bool = False) -> str | None:
    """None when ``uid:gid`` (no supplementary groups, as sandboxed code runs) can search every
    directory from ``/`` down to ``path`` (and read ``path`` itself when ``read``); else a
    message naming the first directory that blocks it and how to fix that."""
    chain = [*reversed(path.parents), path]
    for i, d in enumerate(chain):
        try:
            st = os.stat(d)
        except OSError as e:
            return f"sandbox uid {uid} cannot reach {path}: {d}: {e.strerror or e}"
        last = i == len(chain) - 1
        need = 0o5 if last and read else 0o1
        if st.st_uid == uid:
            who, bits = "u", (st.st_mode >> 6) & 0o7
        elif st.st_gid == gid:
            who, bits = "g", (st.st_mode >> 3) & 0o7
        else:
            who, bits = "o", st.st_mode & 0o7
        if bits & need != need:
            what = "read and search (r-x)" if need == 0o5 else "search (x)"
            fix = f"{who}+{'rx' if need == 0o5 else 'x'}"
            return (
                f"sandbox uid {uid} cannot reach {path}: {d} (mode {st.st_mode & 0o7777:04o}, owner "
                f"{st.st_uid}:{st.st_gid}) does not grant it {what} permission; run "
                f"`chmod {fix} {d}`, or set agent.sandbox.root to a directory it can reach"
            )
    return None


def make_root(root: Path, owner: tuple[int, int] | None) -> None:
    """Create the sandbox root, and any parent we create, with the mode ``ensure`` keeps.

    Parents that already exist are not ours to change: ``traversal_problem`` reports them.
    """
    mode = shared_dir_mode(owner)
    missing = [p for p in (root, *root.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        if mode & 0o001:  # the sandbox uid must pass through what we create for it
            os.chmod(p, (os.stat(p).st_mode & 0o7777) | 0o111)
    os.chmod(root, mode)


class UidPool:
    """A distinct host uid (and gid of the same number) per thread, from ``[first, first+count)``.

    Persistent without a table: a thread's uid is the owner of its dir, which ``ensure`` sets.
    A thread dir owned by a uid outside the range (or one another thread dir already holds) gets
    a fresh uid, and ``ensure`` hands its tree over. One pool per root and process; two daemons
    must not share a root.
    """

    def __init__(self, root: Path, first: int, count: int) -> None:
        self.threads = root / "threads"
        self.first, self.count = first, count
        self._lock = threading.Lock()
        self._by_uid: dict[int, str] | None = None

    def _in_range(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    def _scan(self) -> dict[int, str]:
        by_uid: dict[int, str] = {}
        try:
            with os.scandir(self.threads) as it:
                for entry in sorted(it, key=lambda e: e.name):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if entry.is_dir(follow_symlinks=False) and self._in_range(st.st_uid):
                        by_uid.setdefault(st.st_uid, entry.name)
        except FileNotFoundError:
            pass
        return by_uid

    def owner(self, dirs: ThreadDirs) -> tuple[int, int]:
        """The thread's (uid, gid): the one it has, else the lowest free one."""
        name = dirs.base.name
        with self._lock:
            if self._by_uid is None:
                self._by_uid = self._scan()
            try:
                uid: int | None = os.lstat(dirs.base).st_uid
            except FileNotFoundError:
                uid = None
            if uid is not None and self._in_range(uid) and self._by_uid.get(uid, name) == name:
                self._by_uid[uid] = name
                return uid, uid
            for attempt in range(2):
                for candidate in range(self.first, self.first + self.count):
                    if candidate not in self._by_uid:
                        self._by_uid[candidate] = name
                        return candidate, candidate
                if attempt == 0:  # threads deleted since the last scan free their uids
                    self._by_uid = self._scan()
        raise SandboxError(
            f"all {self.count} sandbox uids of agent.sandbox.uid_range are in use; widen the range"
        )
