"""``chital init``: ask which channels and model to use, write ``config.yaml`` and a ``.env`` with
the secrets (mode 0600), then run ``chital check`` on them.

Three ways to answer: at a terminal (secrets through getpass, never echoed); piped on stdin, one
answer a line in the order of the questions (scripts, tests); or ``--yes`` with flags for the
settings and the environment for the secrets (a token in ``argv`` would show in ``ps`` and shell
history, so there is no flag for one). Nothing is written until every answer is in.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import SecretStr

from gateway.cli.common import DEFAULT_CONFIG, ENV_FILE, add_command
from gateway.config.platforms import PLATFORMS, Platform

OPENAI_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_MODEL = "gpt-4o-mini"
NO_KEY = "unused"
"""``api_key`` written for a server that asks for none (the OpenAI client refuses an empty key)."""

HINTS: dict[tuple[str, str], str] = {
    ("telegram", "token"): "Telegram bot token from @BotFather (123456:ABC...)",
    ("slack", "bot_token"): "Slack bot token (xoxb-...)",
    ("slack", "app_token"): "Slack app-level token with connections:write (xapp-...)",
    ("discord", "token"): "Discord bot token (Developer Portal > Bot > Reset Token)",
    ("lark", "app_id"): "Feishu/Lark app id (cli_...)",
    ("lark", "app_secret"): "Feishu/Lark app secret",
    ("matrix", "homeserver"): "Matrix homeserver base URL (https://matrix.example.org)",
    ("matrix", "user_id"): "the bot account's Matrix user id (@chital:example.org)",
    ("matrix", "access_token"): "the bot account's access token (docs/setup/matrix.md)",
    ("whatsapp", "phone_number_id"): "WhatsApp phone number id (App Dashboard > WhatsApp > API Setup)",
    ("whatsapp", "access_token"): "a system user's access token (docs/setup/whatsapp.md)",
    ("whatsapp", "app_secret"): "the Meta app's secret (App settings > Basic)",
    ("whatsapp", "verify_token"): "a verify token of your choosing (also typed into the webhook settings)",
    ("dingtalk", "client_id"): "DingTalk app Client ID (formerly AppKey, ding...)",
    ("dingtalk", "client_secret"): "DingTalk app Client Secret (docs/setup/dingtalk.md)",
    ("wecom", "bot_id"): "WeCom robot's Bot ID (智能机器人 > API mode > long connection)",
    ("wecom", "secret"): "the WeCom robot's long-connection Secret (docs/setup/wecom.md)",
}
SHAPES: dict[tuple[str, str], tuple[re.Pattern[str], str]] = {
    ("telegram", "token"): (re.compile(r"\d+:[A-Za-z0-9_-]+"), "looks like 123456:ABC-..."),
    ("slack", "bot_token"): (re.compile(r"xoxb-.+"), "starts with xoxb- (the app-level token is xapp-)"),
    ("slack", "app_token"): (re.compile(r"xapp-.+"), "starts with xapp- (the bot token is xoxb-)"),
    ("matrix", "homeserver"): (re.compile(r"https?://\S+"), "a URL: https://matrix.example.org"),
    ("matrix", "user_id"): (re.compile(r"@[^:\s]+:\S+"), "looks like @name:example.org"),
    ("whatsapp", "phone_number_id"): (
        re.compile(r"[0-9]{5,32}"),
        "digits: the phone number's id, not the number",
    ),
}
"""Mistakes worth catching before the check: a Slack token pasted in the other's place."""

_SAFE = re.compile(r"[\x21-\x7e]+")
"""A value written to .env: printable ASCII without spaces; quotes and backslashes are refused
below, so single quotes keep it literal for python-dotenv and docker compose alike."""


class Abort(Exception):
    """Stop without writing anything; the message is the one ``chital: init: ...`` line."""


@dataclass
class Answers:
    channels: list[str] = field(default_factory=list)
    base_url: str = ""
    model: str = DEFAULT_MODEL
    secrets: dict[str, str] = field(default_factory=dict)
    """Environment variable -> value, for .env."""
    plain: dict[tuple[str, str], str] = field(default_factory=dict)
    """(platform, field) -> a required value that is no secret (Lark's app id), for config.yaml."""
    lark_domain: str = "feishu"
    online: bool = False
    sandbox_root: Path | None = None
    """As root, when the sandbox uid cannot reach the data directory: where sandboxes live."""


class Asker:
    """One question at a time: at a terminal through input/getpass, else a line of stdin each; with
    ``--yes`` nothing is asked and a question without a default is an error."""

    def __init__(self, *, ask: bool, tty: bool) -> None:
        self.ask_user = ask
        self.tty = tty

    def _line(self, prompt: str, *, secret: bool) -> str:
        if self.tty:
            return getpass.getpass(prompt) if secret else input(prompt)
        print(prompt, flush=True)  # stdin is no terminal: getpass would read /dev/tty instead
        line = sys.stdin.readline()
        if not line:
            raise Abort(f"no answer to {prompt.strip()!r}: stdin ended")
        return line.rstrip("\r\n")

    def ask(self, question: str, default: str = "", *, secret: bool = False, shown: str = "") -> str:
        """The answer, ``default`` for an empty one (``shown`` in its place in the prompt)."""
        if not self.ask_user:
            return default
        hint = shown or default
        answer = self._line(f"{question}{f' [{hint}]' if hint else ''}: ", secret=secret).strip()
        return answer or default

    def retry(self, problem: str) -> None:
        """A bad answer: say why and ask again, unless nothing can be asked again."""
        if not self.ask_user or not self.tty:
            raise Abort(problem)
        print(f"  {problem}", flush=True)


def _is_secret(platform: Platform, name: str) -> bool:
    annotation = platform.settings.model_fields[name].annotation
    return annotation is SecretStr or SecretStr in get_args(annotation)


def _secret_problem(value: str) -> str | None:
    if not _SAFE.fullmatch(value) or "'" in value or "\\" in value:
        return "it has a space, quote, backslash or non-ASCII character: paste the value alone"
    return None


def _platform(name: str) -> Platform:
    return next(p for p in PLATFORMS if p.name == name)


def _parse_channels(text: str) -> list[str]:
    names = [n for n in re.split(r"[\s,]+", text.strip().lower()) if n and n != "none"]
    known = [p.name for p in PLATFORMS]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown channel {unknown[0]!r}: choose from {', '.join(known)} (or none)")
    return [n for n in known if n in names]


def _ask_channels(asker: Asker, flags: list[str] | None) -> list[str]:
    if flags is not None:
        try:
            return _parse_channels(",".join(flags))
        except ValueError as exc:
            raise Abort(str(exc)) from None
    ready = [p.name for p in PLATFORMS if all(os.environ.get(v) for v in p.settings.required.values())]
    if not asker.ask_user:
        return ready
    names = ", ".join(p.name for p in PLATFORMS)
    while True:
        text = asker.ask(
            f"Channels ({names}; comma-separated, 'none' for only `chital chat`)", ",".join(ready)
        )
        try:
            return _parse_channels(text)
        except ValueError as exc:
            asker.retry(str(exc))


def _ask_value(asker: Asker, platform: Platform, name: str, env: str) -> str:
    """One credential: asked (hidden when secret), or ``$env`` when the environment has it."""
    secret = _is_secret(platform, name)
    have = os.environ.get(env, "")
    question = f"{HINTS.get((platform.name, name), f'{platform.name} {name}')} ({env}"
    question += ", hidden)" if secret else ")"
    while True:
        shown = "set in the environment: Enter keeps it" if have and secret else ""
        value = asker.ask(question, have, secret=secret, shown=shown)
        if not value:
            asker.retry(f"{env} is needed for {platform.name} (--yes takes it from the environment)")
            continue
        problem = _secret_problem(value)
        shape = SHAPES.get((platform.name, name))
        if problem is None and shape and not shape[0].fullmatch(value):
            problem = f"that is not a {HINTS[(platform.name, name)].split(' (')[0]}: it {shape[1]}"
        if problem is None:
            return value
        asker.retry(f"{env}: {problem}")


def gather(args: argparse.Namespace, asker: Asker) -> Answers:
    out = Answers(channels=_ask_channels(asker, args.channel))
    while True:
        base = args.base_url if args.base_url is not None else os.environ.get("OPENAI_BASE_URL", "")
        if args.base_url is None:
            base = asker.ask("Model server base URL (OpenAI-compatible; empty: api.openai.com)", base)
        if not base or re.fullmatch(r"https?://\S+", base):
            out.base_url = base.rstrip("/")
            break
        args.base_url = None
        asker.retry(f"base URL {base!r}: give it as http(s)://host[:port]/v1")
    out.model = args.model or asker.ask("Model name", os.environ.get("CHITAL_MODEL") or DEFAULT_MODEL)
    have = os.environ.get(OPENAI_KEY_ENV, "")
    while True:
        shown = "set in the environment: Enter keeps it" if have else ("none" if out.base_url else "")
        key = asker.ask(f"API key ({OPENAI_KEY_ENV}, hidden)", have, secret=True, shown=shown)
        if not key and not out.base_url:
            asker.retry(
                f"{OPENAI_KEY_ENV} is needed for api.openai.com (--yes takes it from the environment)"
            )
            continue
        problem = _secret_problem(key) if key else None
        if problem is None:
            break
        asker.retry(f"{OPENAI_KEY_ENV}: {problem}")
    if key:
        out.secrets[OPENAI_KEY_ENV] = key
    for name in out.channels:
        platform = _platform(name)
        for field_name, env in platform.settings.required.items():
            value = _ask_value(asker, platform, field_name, env)
            if _is_secret(platform, field_name):
                out.secrets[env] = value
            else:
                out.plain[(name, field_name)] = value
        if name == "lark":
            while True:
                domain = args.lark_domain or asker.ask(
                    "Feishu (China) or Lark (international)? feishu, lark or a base URL", "feishu"
                )
                if domain in ("feishu", "lark") or re.fullmatch(r"https?://\S+", domain):
                    out.lark_domain = domain
                    break
                args.lark_domain = None
                asker.retry(f"domain {domain!r}: feishu, lark or https://...")
    out.online = args.online or (
        asker.ask_user and asker.tty and asker.ask("Check the credentials online now? (y/n)", "y")[:1] in "yY"
    )
    return out


def _q(value: str) -> str:
    """A YAML scalar that stays a string (a JSON string is valid YAML)."""
    return json.dumps(value)


def render_config(a: Answers, config: Path) -> str:
    lines = [
        f"# Written by `chital init` on {time.strftime('%Y-%m-%d')}. Secrets are in .env beside this file",
        "# (mode 0600), which chital loads at start without overriding variables already set; a value",
        "# $NAME is read from the environment. Every key: docs/config-reference.md.",
        "",
        "models:",
        "  - name: default",
        "    use: langchain_openai:ChatOpenAI",
        f"    model: {_q(a.model)}",
    ]
    if a.base_url:
        lines.append(f"    base_url: {_q(a.base_url)}")
    if OPENAI_KEY_ENV in a.secrets:
        lines.append(f"    api_key: ${OPENAI_KEY_ENV}")
    else:
        lines.append(f"    api_key: {NO_KEY}   # the server at base_url asks for no key")
    lines += ["", "channels:"]
    for p in PLATFORMS:
        on = p.name in a.channels
        env_names = " and ".join(p.settings.required.values())
        lines += [f"  {p.name}:", f"    enabled: {'true' if on else 'false'}"]
        if not on:
            lines[-1] += f"   # to use it: set {env_names} in .env, then true"
        for field_name, env in p.settings.required.items():
            plain = a.plain.get((p.name, field_name))
            lines.append(f"    {field_name}: {_q(plain) if plain else '$' + env}")
        if p.name == "lark":
            lines.append(f"    domain: {_q(a.lark_domain)}   # feishu | lark | https://your-endpoint")
    lines += [
        "",
        "# Deny by default: whoever writes to the bot gets a pairing code, approved with",
        f"# `chital -c {str(config.resolve()).replace(chr(10), ' ')} pairing approve CODE` (docs/access.md).",
        "# Ids listed here skip pairing; admins (bare ids) approve from chat with /approve CODE.",
        "access:",
        "  allow_users: []",
        "  admins: []",
        "  pairing: true",
        "  group_policy: mention   # in groups: answer when addressed (mention), always (free), never (off)",
        "",
        "storage:",
        "  path: ./data   # beside this file",
        "",
    ]
    if a.sandbox_root is not None:
        lines += [
            "# Sandboxed code runs as an unprivileged uid, which cannot pass through this file's",
            "# directory (a home directory is 0700): its working directories live here instead",
            '# (docs/sandbox.md, "Where the root lives").',
            "agent:",
            "  sandbox:",
            f"    root: {_q(str(a.sandbox_root))}",
            "",
        ]
    return "\n".join(lines)


def render_env(a: Answers) -> str:
    lines = [
        "# Chital's secrets, written by `chital init`. Keep this file private (mode 0600) and out of git.",
        "# chital loads it from beside config.yaml; a variable already set in the environment wins.",
    ]
    lines += [f"{name}='{value}'" for name, value in a.secrets.items()]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, mode: int, *, replace: bool) -> None:
    """Create ``path`` with ``mode`` from the first byte: with O_EXCL (a file that appeared since
    the check is not overwritten, a planted symlink not followed), or, to replace, a private temp
    file renamed over it. Never readable by others, not even while it is being written."""
    data = text.encode()
    if replace:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
    else:
        fd, tmp = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), ""
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp or path).unlink(missing_ok=True)
        raise
    if replace:
        os.replace(tmp, path)


def cmd_init(args: argparse.Namespace) -> int:
    config = Path(getattr(args, "config", None) or os.environ.get("CHITAL_CONFIG") or DEFAULT_CONFIG)
    env_file = config.parent / ENV_FILE
    there = [p for p in (config, env_file) if p.exists() or p.is_symlink()]
    if there and not args.force:
        names = " and ".join(str(p) for p in there)
        print(
            f"chital: init: {names} exist{'s' if len(there) == 1 else ''} already; --force replaces"
            " (nothing was written; -c PATH writes elsewhere)",
            file=sys.stderr,
        )
        return 1
    asker = Asker(ask=not args.yes, tty=sys.stdin.isatty())
    if asker.ask_user:
        print(f"Chital set-up: writes {config} and {env_file}. Nothing is written until the end.")
    try:
        answers = gather(args, asker)
    except Abort as exc:
        print(f"chital: init: {exc}; nothing was written", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, EOFError):
        print("\nchital: init: stopped; nothing was written", file=sys.stderr)
        return 1
    from gateway.cli.sandbox_check import root_for_init

    answers.sandbox_root = root_for_init(config.parent.resolve() / "data")
    try:
        config.parent.mkdir(parents=True, exist_ok=True)
        _write(env_file, render_env(answers), 0o600, replace=args.force)
        try:
            _write(config, render_config(answers, config), 0o644, replace=args.force)
        except BaseException:
            if not args.force:
                env_file.unlink(missing_ok=True)  # ours: created just now with O_EXCL
            raise
    except OSError as exc:
        print(f"chital: init: cannot write {exc.filename or config}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {config} and {env_file} (mode 0600: {', '.join(answers.secrets) or 'no secrets'})")
    if answers.sandbox_root is not None:
        print(
            f"  sandboxes in {answers.sandbox_root}: the sandbox's uid cannot reach {config.parent}"
            " (agent.sandbox.root)"
        )
    for name, value in answers.secrets.items():
        if os.environ.get(name, value) != value:
            print(f"  note: {name} is also set in your environment, which wins over {env_file}")
    from gateway.cli.main import cmd_check

    print(f"\n$ chital check{' --online' if answers.online else ''}")
    code = cmd_check(argparse.Namespace(config=str(config), online=answers.online))
    where = "" if config == Path(DEFAULT_CONFIG) else f" -c {config}"
    if answers.channels:
        print(f"\nnext: `chital{where} run`; then write to the bot: it answers with a pairing code,")
        print(f"      which `chital{where} pairing approve CODE` approves (docs/access.md)")
    else:  # no bot to write to: the terminal is the one way in
        print(f"\nnext: `chital{where} chat` talks to the agent in this terminal; to add a channel,")
        print(f"      set its tokens in {env_file} and `enabled: true` in {config} (docs/setup/)")
    return code


def add_parser(sub: Any) -> None:
    init = add_command(
        sub,
        "init",
        "set up: write config.yaml and .env from a few questions",
        cmd_init,
        description="Ask which channels and model to use and their tokens, write config.yaml and a .env"
        " with the secrets (mode 0600) beside it, then run `chital check`. At a terminal secrets are"
        " not echoed; piped, one answer a line; with --yes nothing is asked (secrets come from the"
        " environment: OPENAI_API_KEY, TELEGRAM_BOT_TOKEN, ...).",
    )
    names = ", ".join(p.name for p in PLATFORMS)
    init.add_argument(
        "--channel",
        action="append",
        metavar="NAME",
        help=f"a channel to turn on ({names}, or none); repeat or comma-separate (default: asked)",
    )
    init.add_argument("--model", metavar="NAME", help=f"the model's name (default: asked, {DEFAULT_MODEL})")
    init.add_argument(
        "--base-url", metavar="URL", help="an OpenAI-compatible server's URL (default: asked; empty: OpenAI)"
    )
    init.add_argument("--lark-domain", metavar="DOMAIN", help="feishu, lark or a base URL (default: feishu)")
    init.add_argument("-y", "--yes", action="store_true", help="ask nothing: flags, then the environment")
    init.add_argument("--force", action="store_true", help="replace an existing config.yaml and .env")
    init.add_argument("--online", action="store_true", help="check the credentials online afterwards")
