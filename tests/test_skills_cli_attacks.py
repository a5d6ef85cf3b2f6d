"""``chital skills list|install|remove`` attacked from the shell, as an operator runs it (a real
subprocess): downloads that are too big (with and without a Content-Length), redirects to the
loopback and cloud-metadata addresses in their several spellings, a redirect loop, credentials in
the URL; names that climb out of the skills folder or collide with a chat command or a shipped
skill; archives with links, absolute and ``..`` paths; and a description that would drive the
terminal. Asserted is what the operator sees (exit code and output) and what is on disk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.daemon import run_chital
from tests.skill_archives import Entry, make_tar_gz, make_zip, skill_md

GOOD = make_zip([Entry("SKILL.md", skill_md("fetched-skill", "Fetched."))])
BIG = 10 * 1024 * 1024 + 1


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A local archive server with the misbehaviours the tests ask for, by path."""

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/good.zip":
            return web.Response(body=GOOD)
        if path == "/big-declared.zip":
            return web.Response(body=b"\0" * BIG)
        if path == "/big-chunked.zip":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            chunk = b"\0" * (1024 * 1024)
            for _ in range(11):
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        if path == "/loop":
            raise web.HTTPFound("/loop")
        if path.startswith("/to/"):
            raise web.HTTPFound(request.query["where"])
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def config(tmp_path: Path, allow: list[str] | None = None) -> str:
    lines = ["agent:", "  skills:", f"    custom_dir: {tmp_path / 'custom'}"]
    if allow is not None:
        lines += ["  web:", f"    allow_hosts: {allow}"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def installed(tmp_path: Path) -> list[str]:
    root = tmp_path / "custom"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


async def test_url_installs_are_bounded_and_never_reach_internal_addresses(
    tmp_path: Path, server: str
) -> None:
    cfg = config(tmp_path, ["127.0.0.1"])  # the test server's address only: nothing else internal
    for path in ("/big-declared.zip", "/big-chunked.zip"):
        done = await run_chital("skills", "install", server + path, "-c", cfg)
        assert done.code == 1 and "larger than 10,485,760 bytes" in done.out, done.out
    for where in (
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://[::ffff:169.254.169.254]/",  # the same, IPv4-mapped
        "http://0xa9fea9fe/",  # the same, as one hex number
        "http://2852039166/",  # ... as one decimal number
        "http://127.0.0.2:9/x.zip",  # loopback outside what allow_hosts opens
        "http://[::1]:9/x.zip",
        "http://10.0.0.1/x.zip",
        "file:///etc/passwd",
    ):
        done = await run_chital("skills", "install", f"{server}/to/x?where={where}", "-c", cfg)
        assert done.code == 1 and "refused" in done.out, (where, done.out)
        assert "Traceback" not in done.out
    loop = await run_chital("skills", "install", server + "/loop", "-c", cfg)
    assert loop.code == 1 and "too many redirects" in loop.out
    secret = await run_chital(
        "skills",
        "install",
        server.replace("http://", "http://ann:pa55word@") + "/nope.zip?sig=TOKEN123",
        "-c",
        cfg,
    )
    assert secret.code == 1 and "HTTP 404" in secret.out
    assert "pa55word" not in secret.out and "TOKEN123" not in secret.out
    assert installed(tmp_path) == []
    ok = await run_chital("skills", "install", server + "/good.zip", "-c", cfg)
    assert ok.code == 0 and "installed fetched-skill" in ok.out, ok.out
    # Without allow_hosts, the same server (a loopback address) is refused outright.
    refused = await run_chital("skills", "install", server + "/good.zip", "-c", config(tmp_path / "x"))
    assert refused.code == 1 and "refused" in refused.out


async def test_names_cannot_climb_out_or_take_a_command_or_shipped_name(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    (tmp_path / "custom" / "keep").mkdir(parents=True)
    (tmp_path / "custom" / "keep" / "SKILL.md").write_text(skill_md("keep").decode())
    (tmp_path / "precious").mkdir()
    for name in ("../precious", "..", ".", "keep/../../precious", "/etc", ".drafts", "KEEP", "keep "):
        done = await run_chital("skills", "remove", name, "-c", cfg)
        assert done.code == 1 and "no custom skill named" in done.out, (name, done.out)
    assert (tmp_path / "precious").is_dir() and installed(tmp_path) == ["keep"]
    shipped = await run_chital("skills", "remove", "deep-research", "-c", cfg)
    assert shipped.code == 1 and "shipped skill" in shipped.out
    for name, why in (("help", "chat command"), ("stop", "chat command"), ("deep-research", "shipped skill")):
        archive = tmp_path / f"{name}.zip"
        archive.write_bytes(make_zip([Entry("SKILL.md", skill_md(name))]))
        done = await run_chital("skills", "install", str(archive), "-c", cfg)
        assert done.code == 1 and why in done.out, (name, done.out)
    assert installed(tmp_path) == ["keep"]


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([Entry("SKILL.md", skill_md("x")), Entry("/etc/cron.d/evil", b"x")], "absolute"),
        ([Entry("SKILL.md", skill_md("x")), Entry("a/../../escape", b"x")], "'..'"),
        (
            [Entry("SKILL.md", skill_md("x")), Entry("link", kind="symlink", target="/etc/shadow")],
            "is a link",
        ),
        ([Entry("SKILL.md", skill_md("x")), Entry("hard", kind="hardlink", target="SKILL.md")], "is a link"),
        ([Entry("SKILL.md", skill_md("x")), Entry("dev", kind="chr")], "regular files"),
    ],
)
async def test_archives_with_links_or_escaping_paths_write_nothing(
    tmp_path: Path, entries: list[Entry], why: str
) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(make_tar_gz(entries))
    done = await run_chital("skills", "install", str(archive), "-c", config(tmp_path))
    assert done.code == 1 and why in done.out, done.out
    assert not (tmp_path / "custom").exists() or installed(tmp_path) == []
    assert not (tmp_path / "escape").exists()


async def test_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.zip"
    os.mkfifo(fifo)  # opening it for reading would block for ever
    for source in (str(fifo), "/dev/zero", str(tmp_path)):
        done = await run_chital("skills", "install", source, "-c", config(tmp_path), timeout=30)
        assert done.code == 2 and "is not a file" in done.out, (source, done.out)


async def test_list_shows_hostile_descriptions_inert(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    folder = tmp_path / "custom" / "loud"
    folder.mkdir(parents=True)
    description = '"Red \\e[31m alert \\e]52;c;ZXZpbA==\\a \\u202eexe.txt"'
    (folder / "SKILL.md").write_text(f"---\nname: loud\ndescription: {description}\n---\n\nBody.\n")
    done = await run_chital("skills", "list", "-c", cfg)
    assert done.code == 0 and "loud  [custom, active]" in done.out, done.out
    assert "\x1b" not in done.out and "\x07" not in done.out and "\u202e" not in done.out
