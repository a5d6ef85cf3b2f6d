"""Fixtures the tests share, each defined once here: the fake model, the fake Telegram, Slack, Discord
and Lark servers, the in-process gateway rig, the loopback canary, the fake search providers and the
fake LangSmith endpoint, the fake Kubernetes API server with a provider per daemon.
A test module uses these rather than writing its own copy (tests/test_suite_shape.py keeps modules
from importing each other's helpers; support modules hold the plain helpers)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import discord.gateway
import discord.http
import pytest

from tests.browser import Browser, chromium
from tests.browser import missing as browser_missing
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.bark_server import FakeBark
from tests.fakes.canary_server import Canary
from tests.fakes.dingtalk_server import FakeDingTalk
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import Rig, fake_rig, gateway_rig
from tests.fakes.kubernetes_server import FakeKubernetes
from tests.fakes.langsmith_server import FakeLangSmith
from tests.fakes.lark_server import FakeLark
from tests.fakes.matrix_server import FakeMatrix
from tests.fakes.ntfy_server import FakeNtfy
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.search_server import FakeSearch
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.wecom_server import FakeWeCom
from tests.fakes.whatsapp_server import FakeWhatsApp
from tests.telegram_daemon import telegram_config

if TYPE_CHECKING:
    from gateway.store.journal import Store
    from tests.kubernetes_support import Make


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
async def search() -> AsyncIterator[FakeSearch]:
    """The fake search providers (DuckDuckGo HTML, Brave, SearXNG, Exa, Tavily, Jina) on loopback."""
    fake = await FakeSearch().start()
    try:
        yield fake
    finally:
        await fake.stop()


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
async def harnesses() -> AsyncIterator[list[Any]]:
    """The agent harnesses a test started (it appends each): all closed when the test ends."""
    made: list[Any] = []
    yield made
    for harness in made:
        await harness.close()


@pytest.fixture
def threaded_model() -> Iterator[FakeOpenAI]:
    """A fake model with no rules on a thread of its own, for tests that block their loop
    (pexpect, subprocess.run) while the model must keep answering."""
    server = FakeOpenAI.start_in_thread()
    yield server
    server.stop()


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
    async with started_daemon(tmp_path, telegram_config(tmp_path, tg, model)) as d:
        yield d


@pytest.fixture
async def bark() -> AsyncIterator[FakeBark]:
    """A fake Bark server on 127.0.0.1 knowing one device key (tests/fakes/bark_server.py)."""
    fake = FakeBark()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def ntfy() -> AsyncIterator[FakeNtfy]:
    """A fake ntfy server on 127.0.0.1 that wants a bearer token (tests/fakes/ntfy_server.py)."""
    fake = FakeNtfy(token="tk_ntfytesttoken0123456789")
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def matrix_hs() -> AsyncIterator[FakeMatrix]:
    """The fake Matrix homeserver (tests/fakes/matrix_server.py)."""
    fake = FakeMatrix()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def whatsapp() -> AsyncIterator[FakeWhatsApp]:
    """The fake WhatsApp Cloud API and webhook driver (tests/fakes/whatsapp_server.py)."""
    fake = FakeWhatsApp()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def dingtalk() -> AsyncIterator[FakeDingTalk]:
    """The fake DingTalk Stream gateway and robot OpenAPI (tests/fakes/dingtalk_server.py)."""
    fake = FakeDingTalk()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def wecom() -> AsyncIterator[FakeWeCom]:
    """The fake WeCom robot long connection (tests/fakes/wecom_server.py)."""
    fake = FakeWeCom()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def dc_heartbeat() -> float:
    """Seconds between the fake Discord's heartbeats. The adapter tests override this fixture with
    0.5 s, so a stalled connection is noticed within their 1.5 s heartbeat timeout."""
    return 1.0


@pytest.fixture
async def dc(dc_heartbeat: float) -> AsyncIterator[FakeDiscord]:
    fake = FakeDiscord(heartbeat_interval=dc_heartbeat)
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def discord_endpoints_restored() -> Iterator[None]:
    """The Discord adapter points process-wide discord.py class attributes at its configured
    addresses; put them back after a test that builds the adapter in this process."""
    base, gateway = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = base, gateway


@pytest.fixture
def lark_ping() -> int:
    """Seconds between the SDK's pings that the fake Lark asks for. The adapter tests override it
    with 30, so pings do not interleave with the frames they count."""
    return 1


@pytest.fixture
def lark(lark_ping: int) -> Iterator[FakeLark]:
    fake = FakeLark(ping_interval=lark_ping)
    fake.start()  # its own thread: the SDK's blocking calls must never meet a test's loop
    yield fake
    fake.stop()


@pytest.fixture
def allowed_users() -> list[str]:
    """Who :func:`adapter_rig`'s gateway lets in; a module overrides it with its own users."""
    return []


@pytest.fixture
async def adapter_rig(tmp_path: Path, allowed_users: list[str]) -> AsyncIterator[Rig]:
    """A real gateway (fake harness) for a real adapter under test, allowing ``allowed_users``;
    attach the adapter with ``tests.fakes.gateway_rig.running``."""
    async with gateway_rig(tmp_path, allowed_users) as r:
        yield r


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


@pytest.fixture
def demo_skills(root: Path) -> Path:
    """A skills folder under the sandbox root with one skill, ``demo``, readable by the sandbox user."""
    s = root / "skills"
    (s / "demo").mkdir(parents=True)
    (s / "demo" / "SKILL.md").write_text("# Demo\n")
    os.chmod(s, 0o755)
    return s


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mounts a tmpfs of a given size (``tmpfs("2m")``) under the test's folder, unmounted after
    the test; skips the test where this machine cannot mount one (it needs CAP_SYS_ADMIN)."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        at = tmp_path / f"disk{len(mounts)}"
        at.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(at)], capture_output=True
        )
        if done.returncode:
            pytest.skip("this machine cannot mount a tmpfs (it needs root or CAP_SYS_ADMIN)")
        mounts.append(at)
        return at

    try:
        yield mount
    finally:
        for at in mounts:
            subprocess.run(["umount", "-l", str(at)], check=False)


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


@pytest.fixture(params=["sqlite", "postgres"])
async def either_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """The gateway's store on SQLite, then on a fresh PostgreSQL database (skipped where none can
    run): for tests that must get the same answers from both."""
    from gateway.store.journal import Store

    if request.param == "sqlite":
        s = await Store.open(tmp_path / "g.sqlite", 0)
    else:
        s = await Store.open_postgres(request.getfixturevalue("pg_url"))
    yield s
    await s.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """A fresh headless Chromium (tests/browser.py); the test skips, saying why, where Debian's
    chromium, its driver or selenium is missing."""
    why = browser_missing()
    if why is not None:
        pytest.skip(why)
    async with chromium() as b:
        yield b


@pytest.fixture(params=["sqlite", "postgres"])
async def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """Two connections to one database, as two daemons (or a daemon and the CLI) have: on SQLite,
    then on a fresh PostgreSQL database (skipped where none can run). For what must hold across
    processes, not only within one."""
    from gateway.store.journal import Store

    if request.param == "sqlite":
        stores = [await Store.open(tmp_path / "g.sqlite", 0) for _ in range(2)]
    else:
        url = request.getfixturevalue("pg_url")
        stores = [await Store.open_postgres(url) for _ in range(2)]
    yield stores[0], stores[1]
    for s in stores:
        await s.close()


@pytest.fixture
async def k8s(tmp_path: Path) -> AsyncIterator[FakeKubernetes]:
    """The fake Kubernetes API server (tests/fakes/kubernetes_server.py), namespace ``chital``."""
    from tests.kubernetes_support import NS

    async with FakeKubernetes(tmp_path / "k8s", namespace=NS, start_delay=0.1) as fake:
        yield fake


@pytest.fixture
async def make(tmp_path: Path, k8s: FakeKubernetes) -> AsyncIterator[Make]:
    """A kubernetes provider per call against ``k8s`` (a daemon each), closed after the test."""
    from agent.sandbox import SandboxLimits
    from agent.sandbox.config import KubernetesSettings
    from agent.sandbox.kubernetes_provider import KubernetesProvider
    from tests.kubernetes_support import NS

    made: list[KubernetesProvider] = []
    config = k8s.write_kubeconfig(tmp_path / "kubeconfig")

    def new(**kw: Any) -> KubernetesProvider:
        settings = KubernetesSettings(
            kubeconfig=kw.pop("kubeconfig", config),
            namespace=NS,
            image="chital-sandbox:test",
            start_timeout=60,
        )
        limits = kw.pop("limits", SandboxLimits(memory_mb=256, disk_mb=20))
        p = KubernetesProvider(tmp_path / f"root-{len(made)}", settings, limits=limits, **kw)
        made.append(p)
        return p

    yield new
    await asyncio.gather(*(p.close() for p in made))
