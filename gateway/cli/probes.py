"""What ``chital check`` verifies beyond the schema: that each model can be built (offline) and, with
``--online``, that every credential is accepted by its service.

Offline, a model class that cannot be imported, settings its constructor refuses, or a missing API
key fail the check and name the field (``models[0].use``), because the daemon would otherwise start
and answer every message with "the model is not configured". Online, one cheap read-only call per
service tells whether the credentials work: Telegram ``getMe``, Slack ``auth.test`` (bot token) and
``apps.connections.open`` (app token, Socket Mode), Discord ``GET /users/@me``, Lark
``tenant_access_token/internal``, a push target's read-only endpoint (:func:`probe_push`), and
``GET {base_url}/models`` for an OpenAI-compatible model (a
one-token completion where a server has no model list). Reasons never carry a secret: every known
secret is masked in them, and URLs (Telegram puts the token in the path) are never printed.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.config.platforms import channel_readiness
from gateway.config.schema import Config
from gateway.config.secrets import redactor_for

PROBE_TIMEOUT = 10.0
LARK_DOMAINS = {"feishu": "https://open.feishu.cn", "lark": "https://open.larksuite.com"}
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


class ProbeFailed(Exception):
    """A probe's one-line reason (secrets already masked by the caller)."""


@dataclass(slots=True)
class Outcome:
    name: str
    ok: bool | None
    """True: OK, False: FAILED, None: skipped."""
    detail: str

    def line(self) -> str:
        state = {True: "OK", False: "FAILED:", None: "SKIPPED:"}[self.ok]
        return f"  {self.name:<16} {state} {self.detail}".rstrip()


# -- offline: can each model be built? -------------------------------------------------------------
def _secret(value: object) -> str | None:
    getter = getattr(value, "get_secret_value", None)
    raw = getter() if getter else value
    return str(raw) if raw else None


def openai_compatible(use: str) -> bool:
    return use.startswith("langchain_openai:")


def model_key(kwargs: dict[str, Any]) -> str | None:
    return _secret(kwargs.get("api_key") or kwargs.get("openai_api_key")) or os.environ.get("OPENAI_API_KEY")


def model_problems(cfg: Config) -> list[str]:
    """One line per model that cannot be built, each starting with the field to fix."""
    from agent.model import build_chat_model, has_api_key, keyless_server, unknown_settings

    problems: list[str] = []
    for i, spec in enumerate(cfg.models):
        field = f"models[{i}]"
        module_name, _, class_name = spec.use.partition(":")
        if not module_name or not class_name:
            problems.append(f"{field}.use: must look like 'module:Class', got {spec.use!r}")
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            problems.append(f"{field}.use: cannot import {module_name!r} ({type(exc).__name__}: {exc})")
            continue
        if not hasattr(module, class_name):
            problems.append(f"{field}.use: {module_name!r} has no {class_name!r}")
            continue
        unknown = unknown_settings(spec, getattr(module, class_name))
        problems += [f"{field}.{key}: {why}" for key, why in unknown]
        if unknown:
            continue
        if openai_compatible(spec.use) and not has_api_key(spec) and not keyless_server(spec):
            problems.append(
                f"{field}.api_key: missing (set OPENAI_API_KEY, or {field}.api_key in config.yaml;"
                " a server of your own that needs no key: set its base_url)"
            )
            continue
        try:
            build_chat_model(spec, cfg.agent)
        except Exception as exc:  # build_chat_model's messages never echo constructor values
            problems.append(f"{field}: cannot build {spec.use}: {exc} (check its settings and API key)")
    return problems


# -- online: are the credentials accepted? ---------------------------------------------------------
async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    try:
        data = await resp.json(content_type=None)
    except Exception:
        raise ProbeFailed(f"HTTP {resp.status}, not a JSON answer") from None
    if not isinstance(data, dict):
        raise ProbeFailed(f"HTTP {resp.status}, unexpected answer")
    return data


async def probe_telegram(session: aiohttp.ClientSession, cfg: Config) -> str:
    c = cfg.channels.telegram
    async with session.get(f"{c.base_url}{_secret(c.token)}/getMe") as resp:
        data = await _json(resp)
    if data.get("ok"):
        bot = data.get("result") or {}
        return f"getMe: @{bot.get('username')} (id {bot.get('id')})"
    raise ProbeFailed(f"getMe: {data.get('error_code', resp.status)} {data.get('description', '')}".strip())


async def probe_slack(session: aiohttp.ClientSession, cfg: Config) -> str:
    c = cfg.channels.slack
    base = c.api_base_url if c.api_base_url.endswith("/") else c.api_base_url + "/"
    found: list[str] = []
    for method, token in (("auth.test", c.bot_token), ("apps.connections.open", c.app_token)):
        headers = {"Authorization": f"Bearer {_secret(token)}"}
        async with session.post(base + method, headers=headers) as resp:
            data = await _json(resp)
        if not data.get("ok"):
            raise ProbeFailed(f"{method}: {data.get('error') or f'HTTP {resp.status}'}")
        if method == "auth.test":
            found.append(f"auth.test: team {data.get('team')!s}, bot {data.get('user')!s}")
        else:
            found.append("apps.connections.open: Socket Mode allowed")
    return "; ".join(found)


async def probe_discord(session: aiohttp.ClientSession, cfg: Config) -> str:
    c = cfg.channels.discord
    headers = {"Authorization": f"Bot {_secret(c.token)}"}
    async with session.get(f"{c.api_base_url.rstrip('/')}/users/@me", headers=headers) as resp:
        data = await _json(resp)
        status = resp.status
    if status == 200:
        return f"GET /users/@me: {data.get('username')} (id {data.get('id')})"
    message = str(data.get("message") or "").removeprefix(f"{status}: ")
    raise ProbeFailed(f"GET /users/@me: HTTP {status}" + (f": {message}" if message else ""))


async def probe_lark(session: aiohttp.ClientSession, cfg: Config) -> str:
    c = cfg.channels.lark
    base = LARK_DOMAINS.get(c.domain, c.domain).rstrip("/")
    body = {"app_id": c.app_id, "app_secret": _secret(c.app_secret)}
    async with session.post(f"{base}/open-apis/auth/v3/tenant_access_token/internal", json=body) as resp:
        data = await _json(resp)
    if data.get("code") == 0 and data.get("tenant_access_token"):
        return "tenant_access_token: granted"
    raise ProbeFailed(f"tenant_access_token: code {data.get('code')} {data.get('msg', '')}".strip())


async def probe_matrix(session: aiohttp.ClientSession, cfg: Config) -> str:
    c = cfg.channels.matrix
    headers = {"Authorization": f"Bearer {_secret(c.access_token)}"}
    url = f"{c.homeserver.rstrip('/')}/_matrix/client/v3/account/whoami"
    async with session.get(url, headers=headers) as resp:
        data = await _json(resp)
        status = resp.status
    if status == 200 and data.get("user_id") == c.user_id:
        return f"whoami: {c.user_id}"
    if status == 200:
        raise ProbeFailed(f"whoami: the token belongs to {data.get('user_id')!s}, not {c.user_id}")
    raise ProbeFailed(f"whoami: HTTP {status} {data.get('errcode', '')} {data.get('error', '')}".strip())


async def probe_whatsapp(session: aiohttp.ClientSession, cfg: Config) -> str:
    """The phone number's record with the token (Graph error 190: refused). The webhook itself
    can only be checked from Meta's side (docs/setup/whatsapp.md)."""
    c = cfg.channels.whatsapp
    headers = {"Authorization": f"Bearer {_secret(c.access_token)}"}
    url = f"{c.graph_url.rstrip('/')}/{c.api_version}/{c.phone_number_id}"
    async with session.get(url, headers=headers, params={"fields": "display_phone_number"}) as resp:
        data = await _json(resp)
        status = resp.status
    if status == 200 and data.get("id") == c.phone_number_id:
        return f"phone number: {data.get('display_phone_number') or c.phone_number_id}"
    err = data["error"] if isinstance(data.get("error"), dict) else {}
    raise ProbeFailed(f"GET phone number: HTTP {status} Graph error {err.get('code', '?')} "
                      f"{str(err.get('message', ''))[:200]}".strip())  # fmt: skip


async def probe_dingtalk(session: aiohttp.ClientSession, cfg: Config) -> str:
    """The app's access token: the same call the adapter makes first (a refused secret is what a
    revoked or mistyped Client Secret looks like)."""
    c = cfg.channels.dingtalk
    body = {"appKey": c.client_id, "appSecret": _secret(c.client_secret)}
    async with session.post(f"{c.api_base.rstrip('/')}/v1.0/oauth2/accessToken", json=body) as resp:
        data = await _json(resp)
        status = resp.status
    if status == 200 and data.get("accessToken"):
        return "accessToken: granted"
    raise ProbeFailed(f"accessToken: HTTP {status} {data.get('code', '')} {data.get('message', '')}".strip())


async def probe_wecom(session: aiohttp.ClientSession, cfg: Config) -> str:
    """Open the robot's long connection, subscribe and close it again (no message is sent). While
    the daemon runs, this subscription takes the connection over for a moment (WeCom keeps one per
    robot); the daemon dials again by itself."""
    from channels.wecom.wire import Refused, Wire

    c = cfg.channels.wecom
    secret = _secret(c.secret) or ""
    async with session.ws_connect(c.ws_url, heartbeat=None) as ws:
        try:
            await Wire(ws, secret).subscribe(c.bot_id, wait=PROBE_TIMEOUT)
        except Refused as exc:
            raise ProbeFailed(f"aibot_subscribe refused: {exc}") from None
    return f"aibot_subscribe: accepted for robot {c.bot_id}"


async def probe_model(session: aiohttp.ClientSession, cfg: Config, index: int) -> str:
    spec = cfg.models[index]
    kwargs = spec.kwargs()
    base = str(
        kwargs.get("base_url")
        or kwargs.get("openai_api_base")
        or os.environ.get("OPENAI_BASE_URL")
        or OPENAI_DEFAULT_BASE
    ).rstrip("/")
    headers = {"Authorization": f"Bearer {model_key(kwargs) or ''}"}
    model = kwargs.get("model") or kwargs.get("model_name")
    async with session.get(f"{base}/models", headers=headers) as resp:
        status = resp.status
        data = await _json(resp) if status == 200 else {}
    if status == 200:
        ids = {str(m.get("id")) for m in data.get("data") or () if isinstance(m, dict)}
        listed = "" if not model else f"; {model!r} {'listed' if model in ids else 'not in the list'}"
        return f"GET /models: {len(ids)} model(s){listed}"
    if status in (401, 403):
        raise ProbeFailed(f"GET /models: HTTP {status}: the API key was refused")
    # Some OpenAI-compatible servers have no model list: one token of a completion tells as much.
    body = {
        "model": model or "gpt-4o-mini",
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    }
    async with session.post(f"{base}/chat/completions", headers=headers, json=body) as resp:
        status = resp.status
        data = await _json(resp) if resp.content_type == "application/json" else {}
    if status == 200:
        return "1-token completion answered (no model list)"
    err = data.get("error")
    message = err.get("message", "") if isinstance(err, dict) else ""
    raise ProbeFailed(f"POST /chat/completions: HTTP {status} {message[:200]}".strip())


async def probe_push(session: aiohttp.ClientSession, cfg: Config, name: str) -> str:
    """A push target without sending a notification (a test push would reach a phone): ntfy's
    ``GET /v1/account`` with the target's credentials (401/403: refused), or ``/v1/health``
    without any; Bark's ``GET /ping`` (the device key can only be checked by a push)."""
    from gateway.delivery.push_wire import auth_headers, refusal

    target = cfg.push[name]
    if target.kind == "bark":
        path, headers = "/ping", {}
        ok = "the Bark server answers (the device key is checked by the first push)"
    else:
        headers = auth_headers(target)
        path = "/v1/account" if headers else "/v1/health"
        ok = "the ntfy server accepts the credentials" if headers else "the ntfy server answers"
    async with session.get(f"{target.server}{path}", headers=headers, allow_redirects=False) as resp:
        if resp.status != 200:
            raise ProbeFailed(f"GET {path}: {refusal(target.kind, resp.status)}")
    return ok


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ProbeFailed):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"no answer within {PROBE_TIMEOUT:g}s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        why = "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else None
        return f"cannot connect to {exc.host}:{exc.port} ({why or exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.InvalidURL):
        return "invalid URL (check the base URL settings)"
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def run_probes(cfg: Config) -> list[Outcome]:
    """Every enabled channel with credentials and every OpenAI-compatible model, concurrently."""
    mask = redactor_for(cfg)

    channels: dict[str, Callable[[aiohttp.ClientSession, Config], Awaitable[str]]] = {
        "telegram": probe_telegram,
        "slack": probe_slack,
        "discord": probe_discord,
        "lark": probe_lark,
        "matrix": probe_matrix,
        "whatsapp": probe_whatsapp,
        "dingtalk": probe_dingtalk,
        "wecom": probe_wecom,
    }
    jobs: list[tuple[str, Callable[[aiohttp.ClientSession], Awaitable[str]] | None, str]] = []
    for name, (ready, why) in channel_readiness(cfg).items():
        enabled = getattr(cfg.channels, name).enabled
        if ready:
            jobs.append((name, functools.partial(_call_probe, channels[name], cfg), ""))
        elif enabled:
            jobs.append((name, None, why))
    for i, spec in enumerate(cfg.models):
        name = f"model {spec.name}"
        if openai_compatible(spec.use):
            jobs.append((name, functools.partial(_probe_model_at, cfg, i), ""))
        else:
            jobs.append((name, None, f"only OpenAI-compatible endpoints are probed ({spec.use})"))

    for target in cfg.push:
        jobs.append((f"push:{target}", functools.partial(_probe_push_named, cfg, target), ""))

    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as session:

        async def one(
            name: str, job: Callable[[aiohttp.ClientSession], Awaitable[str]] | None, why: str
        ) -> Outcome:
            if job is None:
                return Outcome(name, None, why)
            try:
                return Outcome(name, True, mask(await job(session)))
            except Exception as exc:
                return Outcome(name, False, mask(_reason(exc)))

        return list(await asyncio.gather(*(one(*job) for job in jobs)))


async def _call_probe(probe: Any, cfg: Config, session: aiohttp.ClientSession) -> str:
    return str(await probe(session, cfg))


async def _probe_push_named(cfg: Config, name: str, session: aiohttp.ClientSession) -> str:
    return await probe_push(session, cfg, name)


async def _probe_model_at(cfg: Config, index: int, session: aiohttp.ClientSession) -> str:
    return await probe_model(session, cfg, index)
