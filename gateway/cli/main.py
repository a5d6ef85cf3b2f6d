"""The ``chital`` command: init, check, run, chat, pairing.

Exit codes: 0 fine, 1 the daemon could not start, ``check`` found a problem or ``init`` would
overwrite a file, 2 the configuration is invalid or the command line is wrong. A failure is one
``chital: ...`` line on stderr, never a traceback (argparse's usage errors included): the operator
reads it in ``journalctl`` or ``docker logs``.

Each command is declared by ``add_parser(sub)`` (here, or in its own module ``cli_<name>.py``)
through ``cli_common.add_command``; :func:`build_parser` calls them, one line per command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from typing import Any, NoReturn

from compat import lean_imports
from gateway.cli import init as cli_init
from gateway.cli import mcp as cli_mcp
from gateway.cli import migrate as cli_migrate
from gateway.cli import send as cli_send
from gateway.cli import skills as cli_skills
from gateway.cli import status as cli_status
from gateway.cli.chat import cmd_chat
from gateway.cli.common import Formatter, add_command, add_config_option, config_path, load_config_arg
from gateway.cli.pairing import cmd_pairing
from gateway.config.schema import Config


# -- run ---------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from gateway.daemon.app import Daemon
    from gateway.daemon.lifecycle import StartupError
    from gateway.ops.logs import setup_logging

    cfg = load_config_arg(args)
    typos = model_typos(cfg)
    if typos:  # like a misspelt key anywhere else in the file: the configuration is invalid
        print(
            f"chital: {config_path(args.config) or 'built-in defaults'}: invalid configuration",
            file=sys.stderr,
        )
        for line in typos:
            print(f"  {line}", file=sys.stderr)
        return 2
    setup_logging(cfg)
    # Which channels are on and why the others are off, the model and the sandbox: the start-up
    # summary logs them once, after the daemon has tried them (gateway/daemon/summary.py).
    code = 0
    try:
        asyncio.run(Daemon(cfg).run_forever())
    except StartupError as exc:
        print(f"chital: {exc}", file=sys.stderr, flush=True)
        code = 1
    _exit_if_threads_linger(code)
    return code


def model_typos(cfg: Config) -> list[str]:
    """``models[i].key: not a setting of ...; did you mean ...?`` for each key under ``models[]``
    its class does not take (agent/model.py ``unknown_settings``); a class that cannot be imported
    is left to the agent's own report."""
    import importlib

    from agent.model import unknown_settings

    out = []
    for i, spec in enumerate(cfg.models):
        module, _, name = spec.use.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            continue
        out += [f"models[{i}].{key}: {why}" for key, why in unknown_settings(spec, cls)]
    return out


def _exit_if_threads_linger(code: int, wait: float = 3.0) -> None:
    """Every resource was released, so no thread should be left; should a library still hold a
    non-daemon thread, the interpreter would wait for it forever at exit (the hang operators saw).
    Give such threads ``wait`` seconds, then leave anyway with ``code``."""
    deadline = time.monotonic() + wait
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            print(
                f"chital: thread {thread.name!r} did not finish; exiting anyway", file=sys.stderr, flush=True
            )
            os._exit(code)


# -- check -------------------------------------------------------------------------------------------
def print_skills(cfg: Config) -> int:
    """The skills the agent will be offered, as the daemon loads them; a configured folder that
    is missing is a warning (the agent would start without those skills). Returns 0: a skill
    problem does not stop the daemon."""
    import logging

    from agent.skills import SkillCatalog

    skills = cfg.agent.skills
    quiet = logging.getLogger("agent.skills")
    level, quiet.disabled = quiet.level, True  # the check prints its own lines, not the log's
    try:
        names = SkillCatalog(skills).names
    finally:
        quiet.disabled = False
        quiet.setLevel(level)
    print(f"skills: {len(names)} offered: {', '.join(names) or '(none)'}")
    configured = skills.model_fields_set
    for label, path in (("public", skills.public()), ("custom", skills.custom_dir)):
        if path.is_dir():
            print(f"  {label}: {path}")
        elif label == "public" or f"{label}_dir" in configured:
            print(f"  WARNING skills.{label}_dir: {path} does not exist")
    return 0


def print_vendor_check() -> int:
    """One line per library installed outside the releases Chital's reaches into it were verified
    on (compat/versions.py), or one line saying all are. Returns how many would stop the daemon."""
    from compat.versions import check_all

    problems = check_all()
    if not problems:
        print("vendor internals: verified")
    for problem in problems:
        print(problem.line())
    return sum(problem.fatal for problem in problems)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate the config, build each model, say which channels are ready; with ``--online`` also
    ask each service whether the credentials work. Non-zero when anything would fail at run time."""
    from agent.model import keyless_server
    from gateway.cli.probes import model_key, model_problems, run_probes
    from gateway.cli.sandbox_check import check_sandbox, fix_for
    from gateway.config.platforms import channel_readiness

    cfg = load_config_arg(args)
    path = config_path(args.config)
    print(f"config: {path} is valid" if path else "config: no file; the built-in defaults are valid")
    if args.env_loaded:
        print(f"env: {', '.join(args.env_loaded)} from {args.env_file}")
    spec = cfg.model_spec()
    kwargs = spec.kwargs()
    print(
        f"model: {spec.name} → {spec.use} model={kwargs.get('model', '?')} "
        f"base_url={kwargs.get('base_url') or '(default)'} "
        f"api_key={'set' if model_key(kwargs) else 'none needed' if keyless_server(spec) else 'MISSING'}"
    )
    problems = model_problems(cfg)
    for problem in problems:
        print(f"  FAILED {problem}")
    print(f"storage: {cfg.storage.path} (journal kept {cfg.storage.retention_days:g} days)")
    if cfg.storage.retention_days < 1:
        print(
            "  WARNING storage.retention_days is under 1: Telegram redelivers an unconfirmed update for"
            " up to 24 h, which would then be answered twice (docs/durability.md)"
        )
    failed = len(problems)
    failed += print_vendor_check()
    print("channels:")
    ready = 0
    for name, (ok, why) in channel_readiness(cfg).items():
        ready += ok
        print(f"  {name:<9} {'ready' if ok else 'off  '}  {why}")
    if not ready:
        print("no chat channel is ready: `chital run` still starts; `chital chat` talks to the agent here")
    sandbox = check_sandbox(cfg)  # one real command in the sandbox: agent/sandbox/probe.py
    if sandbox.state == "failed":
        failed += 1
        print(f"sandbox: FAILED {sandbox.detail}\n  fix: {fix_for(sandbox)}")
    elif sandbox.state == "unsandboxed":
        print(f"sandbox: WARNING {sandbox.detail}")
    else:
        print(f"sandbox: {sandbox.detail}")
    failed += print_skills(cfg)
    if args.online:
        print("online:")
        for outcome in asyncio.run(run_probes(cfg)):
            print(outcome.line())
            failed += outcome.ok is False
    if failed:
        print(f"chital: check failed: {failed} problem(s)", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    """``run``, ``check`` and ``chat`` (the latter's code is gateway/cli/chat.py)."""
    add_command(
        sub,
        "run",
        "run the daemon: connect the channels, answer messages",
        cmd_run,
        description="Run the daemon: connect every channel whose credentials are set and answer its"
        " messages, until SIGTERM or Ctrl-C. Health and metrics on http.host:http.port.",
    )
    check = add_command(
        sub,
        "check",
        "validate the config; say which channels and model are ready",
        cmd_check,
        description="Validate the config, build each model, say which channels are ready and whether"
        " the sandbox can run code. Exit 1 when anything would fail at run time.",
    )
    check.add_argument(
        "--online", action="store_true", help="also ask each service whether the credentials work"
    )
    add_command(
        sub,
        "chat",
        "talk to the agent in this terminal",
        cmd_chat,
        description="Talk to the agent in this terminal, on the daemon's database and model"
        " (/new starts over, /quit or Ctrl-D leaves).",
    )


def add_pairing_parser(sub: Any) -> None:
    """``pairing list|approve|deny|revoke``: one subcommand each (the work is gateway/cli/pairing.py)."""
    pairing = add_command(
        sub,
        "pairing",
        "list, approve, deny or revoke requests for access",
        None,
        description="Decide who may talk to the bot: strangers who write to it get a pairing code"
        " (docs/access.md); these act on the daemon's database, also while it runs.",
    )
    actions = pairing.add_subparsers(title="actions", dest="action", required=True, metavar="ACTION")
    add_command(actions, "list", "show pending requests and approved users", cmd_pairing).set_defaults(
        arg=None
    )
    approve = add_command(actions, "approve", "let the user who was given CODE talk to the bot", cmd_pairing)
    approve.add_argument("arg", metavar="CODE", help="the pairing code the user was given (see `list`)")
    deny = add_command(
        actions,
        "deny",
        "refuse the request with CODE",
        cmd_pairing,
        description="Refuse the request with CODE; that user gets no new code until it would have expired.",
    )
    deny.add_argument("arg", metavar="CODE", help="the pairing code of the request (see `list`)")
    revoke = add_command(actions, "revoke", "take an approved user's access away", cmd_pairing)
    revoke.add_argument("arg", metavar="USER", help="platform:id, as `list` shows it (e.g. telegram:12345)")


class Parser(argparse.ArgumentParser):
    """Usage errors as one ``chital: ...`` line (exit 2), pointing at the command's ``--help``."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("chital").strip()
        self.exit(2, f"chital: {where + ': ' if where else ''}{message} (see `{self.prog} --help`)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chital")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="chital",
        description="A self-hosted agent in your team's chats (Telegram, Slack, Discord, Feishu/Lark).",
        epilog="`chital COMMAND --help` tells more about each. Start with `chital init`.",
        formatter_class=Formatter,
    )
    add_config_option(parser, top=True)
    parser.add_argument("--version", action="version", version=f"chital {_version()}")
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    cli_init.add_parser(sub)
    add_parser(sub)
    add_pairing_parser(sub)
    cli_status.add_parser(sub)
    cli_send.add_parser(sub)
    cli_skills.add_parser(sub)
    cli_mcp.add_parser(sub)
    cli_migrate.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # First, before any command imports its libraries: defer the parts of them Chital never uses
    # (compat/lean_imports.py; ~20 MB of a daemon's resident memory, docs/performance.md). Explicit
    # here, in the entry point, so importing Chital's modules never changes how libraries load.
    lean_imports.install()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # `chital status --json | head`: the reader left. Python's advice: point stdout at
        # /dev/null so the interpreter's own flush at exit does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
