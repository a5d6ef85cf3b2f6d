"""The general rule: no daemon code follows a link (or blocks on a FIFO) that sandboxed code planted.

Every host-side file operation the daemon performs on a thread's directories (the agent's file tools,
``present_files``'s check, uploads in, presented files out) is run against every kind of plant at the
path it touches. A host canary must never be read, changed or created, and a FIFO must not hang the
call. As root the operations also run with the sandbox user's filesystem identity (creds.py): the
test runs both ways.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox.files import HostFiles
from agent.sandbox.paths import PathMapper, SandboxError, ThreadDirs

CANARY = b"HOST-CANARY-DO-NOT-LEAK"
WS = "/mnt/user-data/workspace"
OUT = "/mnt/user-data/outputs"
UP = "/mnt/user-data/uploads"


def _plant(kind: str, at: Path, host_dir: Path) -> str:
    """Plant ``kind`` at ``at``; returns the name (relative to at.parent) the operation targets."""
    canary = host_dir / "canary.txt"
    if kind == "abs-link":
        at.symlink_to(canary)
    elif kind == "rel-link":
        at.symlink_to(os.path.relpath(canary, at.parent))
    elif kind == "dangling-link":
        at.symlink_to(host_dir / "created-by-daemon.txt")
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "dir-link":
        at.symlink_to(host_dir, target_is_directory=True)
        return f"{at.name}/canary.txt"
    else:  # pragma: no cover - the parametrization lists the kinds
        raise AssertionError(kind)
    return at.name


OPS: dict[str, tuple[str, Callable[[HostFiles, str], Any]]] = {
    "read_bytes": (OUT, lambda f, p: f.read_bytes(p, 1 << 20)),
    "read_text": (WS, lambda f, p: f.read_text(p)),
    "regular_size": (OUT, lambda f, p: f.regular_size(p)),
    "write": (WS, lambda f, p: f.write(p, "overwritten")),
    "edit": (WS, lambda f, p: f.edit(p, "CANARY", "PWNED", replace_all=True)),
    "delete": (WS, lambda f, p: f.delete(p)),
    "stat": (WS, lambda f, p: f.stat(p)),
    "ls": (WS, lambda f, p: f.ls(p.rsplit("/", 1)[0])),
    "grep": (WS, lambda f, p: f.grep("CANARY", WS)),
    "glob": (WS, lambda f, p: f.glob("**/*.txt", WS)),
}
KINDS = ("abs-link", "rel-link", "dangling-link", "fifo", "dir-link")


@pytest.fixture(params=["daemon-uid", "sandbox-uid"])
def files(request: pytest.FixtureRequest, root: Path) -> HostFiles:
    as_sandbox = request.param == "sandbox-uid"
    if as_sandbox and os.geteuid() != 0:
        pytest.skip("only root can act with another user's filesystem identity")
    owner = (1000, 1000) if as_sandbox else None
    dirs = ThreadDirs.for_thread(root, "t1", None)
    dirs.ensure(owner)
    return HostFiles(PathMapper(dirs), owner)


@pytest.fixture
def host_dir(root: Path) -> Path:
    d = root / "host"  # reachable by the sandbox uid: only the boundary keeps the daemon out
    d.mkdir()
    d.chmod(0o777)  # writable by anyone: only the boundary keeps the daemon out
    (d / "canary.txt").write_bytes(CANARY)
    (d / "canary.txt").chmod(0o666)
    return d


def _host_unchanged(host_dir: Path) -> None:
    assert sorted(p.name for p in host_dir.iterdir()) == ["canary.txt"]
    assert (host_dir / "canary.txt").read_bytes() == CANARY


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", sorted(OPS))
async def test_no_operation_follows_a_plant(files: HostFiles, host_dir: Path, op: str, kind: str) -> None:
    mount, call = OPS[op]
    folder = files.mapper.resolve(mount).host
    name = _plant(kind, folder / "target.txt", host_dir)
    try:
        # A FIFO must fail or return at once, never block a daemon thread.
        result = await asyncio.wait_for(asyncio.to_thread(call, files, f"{mount}/{name}"), timeout=5)
    except SandboxError:
        result = None
    assert CANARY not in repr(result).encode()
    if op == "ls" and result is not None:
        assert all("canary" not in e.path for e in result)
    _host_unchanged(host_dir)


@pytest.mark.parametrize("kind", KINDS)
async def test_upload_never_lands_on_a_plant(files: HostFiles, host_dir: Path, kind: str) -> None:
    folder = files.mapper.resolve(UP).host
    if kind == "dir-link":  # a directory link on the path: the upload goes below it
        _plant(kind, folder / "sub", host_dir)
        with pytest.raises(SandboxError):
            await asyncio.wait_for(
                asyncio.to_thread(files.create_unique, f"{UP}/sub", "canary.txt", b"user"), 5
            )
        _host_unchanged(host_dir)
        return
    _plant(kind, folder / "report.txt", host_dir)
    virtual = await asyncio.wait_for(asyncio.to_thread(files.create_unique, UP, "report.txt", b"user"), 5)
    assert virtual == f"{UP}/report-2.txt"
    saved = folder / "report-2.txt"
    assert saved.read_bytes() == b"user" and not saved.is_symlink()
    _host_unchanged(host_dir)


async def test_files_created_for_the_sandbox_user_are_its_own(files: HostFiles) -> None:
    """As root, uploads and tool writes belong to the sandbox user (it must be able to edit them)."""
    virtual = await asyncio.to_thread(files.create_unique, UP, "a.txt", b"x")
    await asyncio.to_thread(files.write, f"{WS}/b/c.txt", "y")
    want = files.owner[0] if files.owner else os.geteuid()
    for v in (virtual, f"{WS}/b", f"{WS}/b/c.txt"):
        assert files.mapper.resolve(v).host.stat().st_uid == want


async def test_sandbox_identity_cannot_read_root_only_files(root: Path) -> None:
    """The second wall on its own: even a path handed straight to the OS is checked as the sandbox
    user. A thread's outputs dir that (somehow) is a link to a root-only dir yields nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    secret_dir = root / "rootonly"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "s.txt").write_bytes(CANARY)
    dirs = ThreadDirs.for_thread(root, "t2", None)
    dirs.ensure((1000, 1000))
    dirs.outputs.rmdir()
    dirs.outputs.symlink_to(secret_dir)  # the mount root itself (resolved by realpath)
    files = HostFiles(PathMapper(dirs), (1000, 1000))
    with pytest.raises(SandboxError):
        await asyncio.to_thread(files.read_bytes, f"{OUT}/s.txt", 1 << 20)
