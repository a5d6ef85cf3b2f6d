"""What every ``chital`` subcommand shares: finding the configuration and its ``.env``, loading
them, and declaring a subcommand the same way as the others (:func:`add_command`)."""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config.schema import Config, ConfigError, load_config

DEFAULT_CONFIG = "config.yaml"
ENV_FILE = ".env"
CONFIG_HELP = "config file (default: $CHITAL_CONFIG, else ./config.yaml); a .env beside it is loaded too"

Command = Callable[[argparse.Namespace], int]


class Formatter(argparse.HelpFormatter):
    """Lists subcommands one a line under their heading, without argparse's ``{run,check,...}``
    line above them (the usage line already says COMMAND); the descriptions start in column 16 so
    each command's fits on its line. argparse has no public hook for this: ``_SubParsersAction`` and
    ``_get_subactions`` are its long-stable internals (renamed, the listing falls back to argparse's own)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=16)

    def _format_action(self, action: argparse.Action) -> str:
        subactions = getattr(action, "_get_subactions", None)
        if isinstance(action, getattr(argparse, "_SubParsersAction", ())) and subactions:
            return "".join(self._format_action(a) for a in subactions())
        return super()._format_action(action)


def add_config_option(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """``-c PATH``. Given before the command (``chital -c x run``) or after it (``chital run -c x``):
    a subcommand's option has no default of its own, so it does not erase the one given before."""
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("-c", "--config", metavar="PATH", default=default, help=CONFIG_HELP)


def add_command(
    sub: Any, name: str, summary: str, func: Command | None, *, description: str | None = None
) -> argparse.ArgumentParser:
    """Declare ``chital NAME``: ``summary`` is its line in ``chital --help`` (lower case, no full
    stop), ``description`` (default: the summary) heads its own ``--help``; it takes ``-c PATH``.
    A command module exposes ``add_parser(sub)`` that calls this, and gateway/cli/main.py's
    ``build_parser`` calls that: one line per command there."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=description or summary[:1].upper() + summary[1:] + ".",
        formatter_class=Formatter,
    )
    add_config_option(parser)
    if func is not None:
        parser.set_defaults(func=func)
    return parser


def config_path(arg: str | None) -> Path | None:
    """The config file to read: ``-c``, else ``$CHITAL_CONFIG``, else ./config.yaml if it exists;
    None when there is none (the built-in defaults apply)."""
    if arg:
        return Path(arg)
    env = os.environ.get("CHITAL_CONFIG")
    if env:
        return Path(env)
    return Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).exists() else None


def load_env_file(path: Path) -> list[str]:
    """Set the variables of the ``.env`` file at ``path`` that the environment does not already
    have (the environment wins, as with docker compose and systemd's EnvironmentFile); return
    their names. A missing file is nothing; one that others may read gets a warning, never its
    values. Parsed by python-dotenv (quotes, ``export``, comments)."""
    from dotenv import dotenv_values

    if not path.is_file():
        return []
    try:
        mode = path.stat().st_mode
        values = dotenv_values(path, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"chital: cannot read {path}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"chital: warning: {path} holds secrets but other users may read it (chmod 600 {path})",
            file=sys.stderr,
        )
    loaded = []
    for name, value in values.items():
        if value is not None and name not in os.environ:
            os.environ[name] = value
            loaded.append(name)
    return loaded


def env_file_for(path: Path | None) -> Path:
    """The ``.env`` read with a config file: beside it; with no config file, in this directory."""
    return (path.parent if path is not None else Path()) / ENV_FILE


def load_config_arg(args: argparse.Namespace) -> Config:
    """The configuration ``args`` name, after its ``.env``. With no config file, say so in one line
    on stderr and what stands in for it (gateway/config/schema.py ``builtin_defaults``)."""
    path = config_path(getattr(args, "config", None))
    args.env_file = env_file_for(path)
    args.env_loaded = load_env_file(args.env_file)
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        print(f"chital: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if path is None:
        from gateway.config.platforms import channel_readiness

        on = [name for name, (ok, _) in channel_readiness(cfg).items() if ok]
        print(
            f"chital: no config file found (-c PATH, $CHITAL_CONFIG or ./{DEFAULT_CONFIG}); using the"
            f" built-in defaults: every channel whose token variables are set (here: "
            f"{', '.join(on) or 'none'}), the model from CHITAL_MODEL / OPENAI_BASE_URL / OPENAI_API_KEY,"
            f" data in {cfg.storage.path.resolve()}; `chital init` writes a config file",
            file=sys.stderr,
            flush=True,
        )
    return cfg


def load_existing_config(args: argparse.Namespace, command: str) -> Config:
    """The configuration for a command that reads (or acts on) what a daemon already holds:
    ``pairing``, ``status``, ``send``. With no config file found (and no ``$CHITAL_DATA``) it
    says so and exits 2: answering from the built-in defaults' ``./data`` would report an empty
    success from whatever directory the operator happens to stand in."""
    if config_path(getattr(args, "config", None)) is None and not os.environ.get("CHITAL_DATA"):
        print(
            f"chital: {command}: no config file found (-c PATH, $CHITAL_CONFIG or ./{DEFAULT_CONFIG}):"
            f" give the daemon's, e.g. `chital -c /path/to/config.yaml {command}`",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return load_config_arg(args)


async def open_existing_store(cfg: Config, command: str) -> Any:
    """The daemon's store, never a new one: SQLite only when ``gateway.sqlite`` exists (opened
    without a disk reserve of its own: the daemon's is beside the file), else exit 1 naming the
    path; PostgreSQL as configured."""
    from gateway.store.journal import Store

    url = cfg.storage.database_url
    if url:
        return await Store.open_postgres(url)
    db = cfg.storage.path / "gateway.sqlite"
    if not db.is_file():
        where = f" (config {cfg.source})" if cfg.source else ""
        print(
            f"chital: {command}: no database at {db}{where}: the daemon has not run with this"
            " configuration; is it the one `chital run` uses?",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return await Store.open(db, reserve_bytes=0)


def sandbox_note(cfg: Config) -> tuple[bool, str]:
    """(fine, one line) on the agent's sandbox: without bubblewrap the local provider refuses to
    run commands (or, with ``allow_unsandboxed``, runs them on the host), so say how to get it."""
    sandbox = cfg.agent.sandbox
    if not cfg.agent.tools:
        return True, "none (agent.tools: false)"
    if sandbox.provider == "docker":
        return True, f"docker, image {sandbox.image}"
    if sandbox.provider == "kubernetes":
        k8s = sandbox.kubernetes
        return True, f"kubernetes, namespace {k8s.namespace}, image {k8s.image or sandbox.image}"
    bwrap = shutil.which("bwrap")
    if bwrap:
        return True, f"local, bubblewrap {bwrap}"
    what = (
        "commands run UNSANDBOXED on this host" if sandbox.allow_unsandboxed else "the agent cannot run code"
    )
    return False, (
        f"local, but bubblewrap is not installed: {what}. Install it: `sudo apt-get install bubblewrap`"
        " (or `sudo bash scripts/setup.sh`), or set agent.sandbox.provider: docker"
    )
