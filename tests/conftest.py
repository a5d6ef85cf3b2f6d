"""Fixtures the tests share, each defined once here: the fake model, the fake Telegram, Slack, Discord
and Lark servers, the in-process gateway rig, the loopback canary and the fake LangSmith endpoint.
A test module uses these rather than writing its own copy (tests/test_suite_shape.py keeps modules
from importing each other's helpers; support modules hold the plain helpers)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess
from tests.fakes.canary_server import Canary
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import Rig, fake_rig
from tests.fakes.langsmith_server import FakeLangSmith
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import telegram_config


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fake listens on 127.0.0.1: a proxy from the environment (HTTP_PROXY, https_proxy,
    ALL_PROXY, in any case) would take the SDKs' requests elsewhere. One fixture for the suite, so
    every test sees the same environment; NO_PROXY goes too, having nothing left to except."""
    for name in list(os.environ):
        if "proxy" in name.lower():
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _fresh_model_http_clients() -> Iterator[None]:
    """langchain-openai keeps one httpx client per (base_url, timeout) for the whole process. Each
    test has its own event loop, and a fake model server's port can come round again in a later
    test, which would then get a client whose connections belong to a closed loop ("Event loop is
    closed" on the model call). A daemon has one loop for its life, so this is the tests' concern."""
    yield
    from langchain_openai.chat_models import _client_utils

    for cached in ("_cached_async_httpx_client", "_cached_sync_httpx_client"):
        clear = getattr(getattr(_client_utils, cached, None), "cache_clear", None)
        if clear is not None:
            clear()


@pytest.fixture
def clear_ran() -> None:
    """Empties the log of what the approval tests' tools ran (``tests.approvals_support.RAN``), so
    each test sees only its own calls. Modules using those tools apply it with ``pytestmark``."""
    from tests.approvals_support import RAN

    RAN.clear()


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    """A loopback server counting connections and requests: a refused fetch leaves both at zero."""
    c = await Canary().start()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
def langsmith() -> Iterator[tuple[str, list[bytes]]]:
    """(endpoint URL, bodies posted to it)."""
    posts: list[bytes] = []
    handler = type("Handler", (FakeLangSmith,), {"posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts
    server.shutdown()
    server.server_close()


@pytest.fixture
async def model() -> AsyncIterator[FakeOpenAI]:
    """An instant fake model answering ``echo: <text>``, plus the demo rules (LONG, SLOW, FAIL429)."""
    fake = FakeOpenAI()
    fake.add_demo_rules()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """The gateway in process with a fake channel and a fake harness (tests/fakes/gateway_rig.py)."""
    async with fake_rig(tmp_path) as r:
        yield r


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake model with no rules: each test scripts its own answers (``fake.script``, rules)."""
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def telegram_daemon(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> AsyncIterator[DaemonProcess]:
    """``chital run`` as a subprocess on the fake Telegram and the fake model, with the users and
    settings of tests/telegram_daemon.py; stopped after the test."""
    d = DaemonProcess(tmp_path, telegram_config(tmp_path, tg, model))
    await d.start()
    yield d
    await d.close()


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    fake = FakeDiscord(heartbeat_interval=1.0)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def lark() -> Iterator[FakeLark]:
    fake = FakeLark(ping_interval=1)
    fake.start()  # its own thread: the SDK's blocking calls must never meet a test's loop
    yield fake
    fake.stop()


@pytest.fixture
def root() -> Iterator[Path]:
    """A sandbox root for the sandbox tests, in /tmp so the sandbox uid can reach it when the tests
    run as root (pytest's own tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="chital-sbx-test-"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One throw-away PostgreSQL cluster for the session (tests/pg_server.py); skipped, with the
    reason, where the server cannot run."""
    from tests.pg_server import find_postgres, postgres_server

    bindir, why = find_postgres()
    if bindir is None:
        pytest.skip(why)
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: object, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the session's cluster."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return pg_server.create_db(name)  # type: ignore[attr-defined]
