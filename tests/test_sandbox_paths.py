"""Path mapping and host-side file tools of the sandbox: every escape must be refused.

No bubblewrap or Docker needed: these act on the thread's host dirs only. The deepagents backend
adapter's file half is tested here too.
"""

from __future__ import annotations

import base64
import os
import shutil
import threading
from pathlib import Path

import pytest

from agent.sandbox import OutputCap, PathRefused, SandboxError, ThreadDirs
from agent.sandbox.backend import SandboxBackend
from agent.sandbox.local import LocalProvider, LocalSandbox
from agent.sandbox.paths import safe_thread_id

WS = "/mnt/user-data/workspace"


@pytest.fixture
def public_skills(root: Path) -> Path:
    s = root / "skills"
    (s / "public" / "demo").mkdir(parents=True)
    (s / "public" / "demo" / "SKILL.md").write_text("# Demo skill\nuse it wisely\n")
    return s


@pytest.fixture
async def plain_sb(root: Path, public_skills: Path) -> LocalSandbox:
    provider = LocalProvider(root / "sbx", public_skills, bwrap=None)
    return await provider.acquire("slack:T1/C1:1700000000.0001")


def test_safe_thread_id_is_safe_and_distinct() -> None:
    a, b = safe_thread_id("a/b"), safe_thread_id("a_b")
    assert a != b
    for t in ("../../etc", "x" * 500, "télégram:42", "a b\x00c"):
        s = safe_thread_id(t)
        assert "/" not in s and ".." not in s and len(s) <= 64 and s.isascii()


def test_thread_dirs_layout(root: Path) -> None:
    dirs = ThreadDirs.for_thread(root, "telegram:42", None)
    dirs.ensure((os.getuid(), os.getgid()))
    assert dirs.base == root.resolve() / "threads" / safe_thread_id("telegram:42")
    for d in (dirs.workspace, dirs.uploads, dirs.outputs):
        assert d.is_dir()


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "../../../../../../etc/passwd",
        f"{WS}/../../../etc/passwd",
        "/etc/passwd",
        "//etc/passwd",
        "/mnt/user-data/../../etc",
        "/mnt/other",
        "/proc/self/environ",
        "bad\x00name",
    ],
)
async def test_traversal_refused(plain_sb: LocalSandbox, path: str) -> None:
    with pytest.raises(PathRefused):
        plain_sb.mapper.resolve(path)
    with pytest.raises(SandboxError):
        await plain_sb.read_file(path)
    with pytest.raises(SandboxError):
        await plain_sb.write_file(path, "x")


async def test_absolute_host_path_refused(plain_sb: LocalSandbox) -> None:
    """A host path is meaningless inside the sandbox, even the thread's own workspace."""
    (plain_sb.dirs.workspace / "a.txt").write_text("hi")
    with pytest.raises(PathRefused):
        await plain_sb.read_file(str(plain_sb.dirs.workspace / "a.txt"))
    with pytest.raises(PathRefused):
        await plain_sb.write_file(str(plain_sb.dirs.workspace / "b.txt"), "x")
    assert (await plain_sb.read_file(f"{WS}/a.txt")).text == "hi"
    assert (await plain_sb.read_file("a.txt")).text == "hi"  # relative means the workspace


async def test_symlink_escape_refused(plain_sb: LocalSandbox) -> None:
    ws = plain_sb.dirs.workspace
    (ws / "etc").symlink_to("/etc")
    (ws / "passwd").symlink_to("/etc/passwd")
    (ws / "up").symlink_to("../..")
    for p in ("etc/passwd", "passwd", "up/threads", "etc"):
        with pytest.raises(PathRefused):
            await plain_sb.read_file(p)
    with pytest.raises(PathRefused):
        await plain_sb.write_file("etc/evil.conf", "x")
    with pytest.raises(PathRefused):
        await plain_sb.write_file("passwd", "x")
    with pytest.raises(PathRefused):
        await plain_sb.ls("etc")
    assert not Path("/etc/evil.conf").exists()
    # Escaping links are not even listed, nor walked by glob/grep.
    names = {e.path for e in await plain_sb.ls(WS)}
    assert names == set()
    assert await plain_sb.glob("**/passwd", WS) == []
    assert await plain_sb.grep("root:", WS) == []


async def test_symlink_inside_sandbox_allowed(plain_sb: LocalSandbox) -> None:
    await plain_sb.write_file("real/data.txt", "payload\n")
    (plain_sb.dirs.workspace / "alias").symlink_to("real")
    assert (await plain_sb.read_file("alias/data.txt")).text == "payload\n"
    assert [e.path for e in await plain_sb.ls(WS)] == [f"{WS}/alias", f"{WS}/real"]


async def test_symlink_swapped_in_after_check_is_refused(plain_sb: LocalSandbox) -> None:
    """TOCTOU: the sandbox swaps a checked directory for a symlink before we open it."""
    await plain_sb.write_file("d/f.txt", "ok")
    resolved = plain_sb.mapper.resolve("d/f.txt", write=True)
    shutil.rmtree(plain_sb.dirs.workspace / "d")
    (plain_sb.dirs.workspace / "d").symlink_to("/etc")
    with pytest.raises(PathRefused):
        plain_sb.files._open_file(resolved, os.O_RDONLY)
    target = plain_sb.mapper.resolve("f.txt", write=True)
    (plain_sb.dirs.workspace / "f.txt").symlink_to("/etc/hostname")
    with pytest.raises(PathRefused):
        plain_sb.files._open_file(target, os.O_WRONLY | os.O_TRUNC)


async def test_skills_read_only(plain_sb: LocalSandbox) -> None:
    assert "Demo skill" in (await plain_sb.read_file("/mnt/skills/public/demo/SKILL.md")).text
    assert [e.path for e in await plain_sb.ls("/mnt/skills")] == ["/mnt/skills/public"]
    for op in (
        plain_sb.write_file("/mnt/skills/public/demo/SKILL.md", "pwned"),
        plain_sb.write_file("/mnt/skills/new.md", "x"),
        plain_sb.edit("/mnt/skills/public/demo/SKILL.md", "Demo", "Evil"),
        plain_sb.delete("/mnt/skills/public"),
    ):
        with pytest.raises(PathRefused, match="read-only"):
            await op
    assert "Demo skill" in (await plain_sb.read_file("/mnt/skills/public/demo/SKILL.md")).text


async def test_mount_roots_cannot_be_deleted(plain_sb: LocalSandbox) -> None:
    with pytest.raises(PathRefused):
        await plain_sb.delete(WS)
    await plain_sb.write_file("x/y.txt", "1")
    await plain_sb.delete("x")
    assert not (plain_sb.dirs.workspace / "x").exists()


async def test_deleting_a_link_removes_the_link_not_its_target(plain_sb: LocalSandbox, root: Path) -> None:
    """The delete tool names a link, not what it points at: the link goes, its target stays (the
    target was deleted before), and a link pointing out of the mount can be deleted too (refused
    before as an escape) without touching the outside file."""
    await plain_sb.write_file("important.txt", "keep\n")
    ws = plain_sb.dirs.workspace
    (ws / "link").symlink_to(ws / "important.txt")
    (ws / "dirlink").symlink_to(ws)
    outside = root / "outside.txt"
    outside.write_text("host\n")
    (ws / "out").symlink_to(outside)
    for name in ("link", "dirlink", "out"):
        assert await plain_sb.delete(name) == f"{WS}/{name}"
        assert not (ws / name).is_symlink()
    assert (ws / "important.txt").read_text() == "keep\n" and outside.read_text() == "host\n"


async def test_a_name_that_is_not_utf8_is_shown_escaped_and_fits_a_request(plain_sb: LocalSandbox) -> None:
    """Bytes 0xff 0xfe in a file's name (sandboxed code can make one) reached the model as lone
    surrogates, which UTF-8 JSON (``ensure_ascii=False``) and the checkpoint's msgpack both refuse
    to encode. The file tools show the name with ``\\x`` escapes."""
    import json

    import ormsgpack

    (plain_sb.dirs.workspace / os.fsdecode(b"\xff\xfe.txt")).write_bytes(b"TODO \xff\n")
    be = SandboxBackend(plain_sb)
    listed = [e["path"] for e in be.ls(WS).entries or []]
    globbed = [m["path"] for m in (await be.aglob("*.txt", WS)).matches or []]
    grepped = (await be.agrep("TODO", path=WS)).matches or []
    want = f"{WS}/\\xff\\xfe.txt"
    assert listed == globbed == [g["path"] for g in grepped] == [want]
    for result in (listed, globbed, grepped):
        json.dumps(result, ensure_ascii=False).encode("utf-8")
        ormsgpack.packb(result)


async def test_a_listing_of_dangling_links_is_cut_not_called_empty(plain_sb: LocalSandbox) -> None:
    """Entries a listing leaves out (links pointing out of the sandbox) count towards its cut: a
    directory of them was listed whole, however many, and answered as empty."""
    from agent.sandbox import bounded

    links = plain_sb.dirs.workspace / "links"
    links.mkdir()
    for i in range(bounded.MAX_LS_LOOKED + 1):
        (links / str(i)).symlink_to("/nowhere")
    listing = await plain_sb.ls(f"{WS}/links")
    assert [e.path for e in listing] == [
        f"{WS}/links/[listing cut at {bounded.MAX_LS_ENTRIES} entries; use glob or execute]"
    ]


async def test_synthetic_dirs(plain_sb: LocalSandbox) -> None:
    assert [e.path for e in await plain_sb.ls("/")] == ["/mnt"]
    assert [e.path for e in await plain_sb.ls("/mnt/user-data")] == [
        "/mnt/user-data/workspace",
        "/mnt/user-data/uploads",
        "/mnt/user-data/outputs",
    ]
    with pytest.raises(SandboxError):
        await plain_sb.write_file("/mnt/user-data/x.txt", "x")


async def test_read_paging(plain_sb: LocalSandbox) -> None:
    await plain_sb.write_file(
        "lines.txt", "".join(f"line {i}\r\n" if i == 3 else f"line {i}\n" for i in range(1, 11))
    )
    w = await plain_sb.read_file("lines.txt", offset=2, limit=3)
    assert (w.start_line, w.end_line, w.total_lines) == (3, 5, 10)
    assert w.text == "line 3\r\nline 4\nline 5\n"
    tail = await plain_sb.read_file("lines.txt", offset=8, limit=100)
    assert (tail.start_line, tail.end_line, tail.text) == (9, 10, "line 9\nline 10\n")
    with pytest.raises(SandboxError, match="past the end"):
        await plain_sb.read_file("lines.txt", offset=10)
    await plain_sb.write_file("empty.txt", "")
    assert (await plain_sb.read_file("empty.txt")).total_lines == 0
    await plain_sb.write_file("blob.bin", b"\x00\x01\x02")
    with pytest.raises(SandboxError, match="binary"):
        await plain_sb.read_file("blob.bin")
    with pytest.raises(SandboxError, match="no such file"):
        await plain_sb.read_file("missing.txt")
    with pytest.raises(SandboxError, match="is a directory"):
        await plain_sb.read_file(WS)


async def test_edit_rules(plain_sb: LocalSandbox) -> None:
    await plain_sb.write_file("e.txt", "alpha beta alpha\n")
    with pytest.raises(SandboxError, match="not found"):
        await plain_sb.edit("e.txt", "gamma", "x")
    with pytest.raises(SandboxError, match="2 times"):
        await plain_sb.edit("e.txt", "alpha", "x")
    assert await plain_sb.edit("e.txt", "beta", "BETA") == 1
    assert await plain_sb.edit("e.txt", "alpha", "A", replace_all=True) == 2
    assert (plain_sb.dirs.workspace / "e.txt").read_text() == "A BETA A\n"


async def test_concurrent_edits_are_serialized(plain_sb: LocalSandbox) -> None:
    """Each edit reads, replaces and writes back; without the per-file lock updates get lost."""
    await plain_sb.write_file("c.txt", " ".join(f"<{i}>" for i in range(40)))
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            plain_sb.files.edit("c.txt", f"<{i}>", f"[{i}]")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert (plain_sb.dirs.workspace / "c.txt").read_text() == " ".join(f"[{i}]" for i in range(40))


async def test_glob_and_grep(plain_sb: LocalSandbox) -> None:
    await plain_sb.write_file("src/app/main.py", "print('TODO: x')\n")
    await plain_sb.write_file("top.py", "x = 1  # TODO(a+b)\n")
    await plain_sb.write_file("notes.md", "nothing\nTODO(a+b) later\n")
    await plain_sb.write_file("/mnt/user-data/uploads/data.csv", "a,b\n")
    await plain_sb.write_file("bin.dat", b"TODO\x00\x00")
    assert sorted(await plain_sb.glob("*.py", WS)) == [f"{WS}/src/app/main.py", f"{WS}/top.py"]
    assert await plain_sb.glob("/*.py", WS) == [f"{WS}/top.py"]
    assert await plain_sb.glob("src/**/*.py", WS) == [f"{WS}/src/app/main.py"]
    assert await plain_sb.glob("**/*.csv") == ["/mnt/user-data/uploads/data.csv"]
    with pytest.raises(PathRefused):
        await plain_sb.glob("../*", WS)
    hits = await plain_sb.grep("TODO(a+b)", WS)  # literal, not a regex
    assert [(h.path, h.line) for h in hits] == [(f"{WS}/notes.md", 2), (f"{WS}/top.py", 1)]
    assert [h.path for h in await plain_sb.grep("TODO", WS, glob="*.py")] == [
        f"{WS}/top.py",
        f"{WS}/src/app/main.py",
    ]
    found, truncated = plain_sb.files.grep("TODO", WS, max_count=1)
    assert len(found) == 1 and truncated
    assert [h.line for h in await plain_sb.grep("later", f"{WS}/notes.md")] == [2]


def test_output_cap_marks_truncation() -> None:
    cap = OutputCap(100)
    cap.feed(b"H" * 60)
    cap.feed(b"m" * 1000)
    cap.feed(b"T" * 50)
    text = cap.text()
    assert cap.truncated and cap.dropped == 1010
    assert text.startswith("H" * 50)
    assert text.endswith("T" * 50)
    assert "[... output truncated: 1010 more bytes ...]" in text
    small = OutputCap(100)
    small.feed(b"ok")
    assert small.text() == "ok" and not small.truncated


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
async def test_files_written_for_sandbox_user(root: Path) -> None:
    provider = LocalProvider(root / "sbx", None, bwrap=None, uid=1000, gid=1000)
    plain_sb = await provider.acquire("t")
    await plain_sb.write_file("deep/dir/f.txt", "x")
    for p in (
        plain_sb.dirs.workspace,
        plain_sb.dirs.workspace / "deep",
        plain_sb.dirs.workspace / "deep/dir/f.txt",
    ):
        assert (p.stat().st_uid, p.stat().st_gid) == (1000, 1000)
    assert (plain_sb.dirs.base.stat().st_mode & 0o777) == 0o700


# --- deepagents backend adapter: file half ---------------------------------------------------


async def test_backend_file_ops(plain_sb: LocalSandbox) -> None:
    be = SandboxBackend(plain_sb)
    assert be.write(f"{WS}/a.txt", "one\ntwo\nthree\n").path == f"{WS}/a.txt"
    r = await be.aread(f"{WS}/a.txt", offset=1, limit=1)
    assert r.error is None and r.file_data is not None
    assert (r.file_data["content"], r.start_line, r.end_line, r.total_lines, r.next_offset) == (
        "two\n",
        2,
        2,
        3,
        2,
    )
    full = be.read(f"{WS}/a.txt")
    assert full.next_offset is None and full.end_line == 3
    assert be.read(f"{WS}/a.txt", limit=0).no_lines_requested
    assert (await be.aedit(f"{WS}/a.txt", "two", "2")).occurrences == 1
    assert "not found" in (be.edit(f"{WS}/a.txt", "zzz", "y").error or "")
    ls = be.ls(WS)
    assert ls.entries == [
        {"path": f"{WS}/a.txt", "is_dir": False, "size": 12, "modified_at": ls.entries[0]["modified_at"]}
    ]
    be.write(f"{WS}/sub/b.py", "# TODO\n")
    assert any(e["path"] == f"{WS}/sub/" and e["is_dir"] for e in (await be.als(WS)).entries or [])
    assert [m["path"] for m in (await be.aglob("**/*.py")).matches or []] == [f"{WS}/sub/b.py"]
    g = await be.agrep("TODO", path=WS, max_count=5)
    assert g.matches == [{"path": f"{WS}/sub/b.py", "line": 1, "text": "# TODO"}]
    assert be.delete(f"{WS}/sub").path == f"{WS}/sub"


async def test_backend_refuses_escapes(plain_sb: LocalSandbox) -> None:
    be = SandboxBackend(plain_sb)
    assert "outside the sandbox" in (be.read("/etc/passwd").error or "")
    assert be.write("/etc/chital-test", "x").error
    assert not Path("/etc/chital-test").exists()
    assert "read-only" in (be.write("/mnt/skills/x.md", "x").error or "")
    assert be.ls("/root").error
    up = be.upload_files([(f"{WS}/u.bin", b"\x00\x01"), ("/etc/x", b"1"), ("/mnt/skills/y", b"1")])
    assert [u.error for u in up] == [None, "permission_denied", "permission_denied"]
    down = be.download_files([f"{WS}/u.bin", f"{WS}/none", WS, "/etc/passwd"])
    assert down[0].content == b"\x00\x01"
    assert [d.error for d in down] == [None, "file_not_found", "is_directory", "permission_denied"]


async def test_backend_reads_images_as_base64(plain_sb: LocalSandbox) -> None:
    """Images go to the model as base64, re-encoded to pixels only (docs/media.md, "Privacy");
    bytes that only look like a PNG are an error, not passed through."""
    import io

    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "where I live")
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 200, 30)).save(out, "PNG", pnginfo=info)
    await plain_sb.write_file("/mnt/user-data/uploads/pic.png", out.getvalue())
    r = SandboxBackend(plain_sb).read("/mnt/user-data/uploads/pic.png")
    assert r.file_data is not None and r.file_data["encoding"] == "base64"
    sent = base64.b64decode(r.file_data["content"])
    assert b"where I live" not in sent and Image.open(io.BytesIO(sent)).getpixel((4, 4)) == (10, 200, 30)
    await plain_sb.write_file("/mnt/user-data/uploads/fake.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    bad = SandboxBackend(plain_sb).read("/mnt/user-data/uploads/fake.png")
    assert bad.error is not None and "not a readable PNG image" in bad.error


def test_create_provider_from_settings(root: Path) -> None:
    from agent.sandbox import SandboxSettings, create_provider
    from agent.sandbox.docker_provider import DockerProvider

    local = create_provider(SandboxSettings(root=root / "a", skills_dir=None))
    assert isinstance(local, LocalProvider) and local.root == (root / "a").resolve()
    docker = create_provider(SandboxSettings(provider="docker", root=root / "b", idle_timeout=5))
    assert isinstance(docker, DockerProvider) and docker.idle_timeout == 5
    with pytest.raises(ValueError):
        SandboxSettings(provider="podman")  # type: ignore[arg-type]
