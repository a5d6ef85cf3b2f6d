"""``chital skills list|install|remove|approve``: the operator's side of skills, from the shell.

It acts on the folders the config names (``agent.skills``), also while a daemon runs: the daemon
looks at the folders every ``skills.reload_seconds`` and picks the change up without a restart.
The checks are agent/skill_install.py's, the same as an admin's ``/skills install`` in chat.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from pathlib import Path
from typing import Any

from gateway.cli.common import add_command, load_config_arg
from gateway.ops.logs import visible

DESCRIPTION_CHARS = 100


def _shown(text: str | None, limit: int = 120) -> str:
    """Text someone else chose (a skill's description, an installer's display name), for a
    terminal: one line, bounded, escapes and bidi controls made visible."""
    one = " ".join((text or "").split())
    return visible(one if len(one) <= limit else one[: limit - 1] + "…")


def reserved_names() -> set[str]:
    """The chat commands' names: a skill called like one could not be asked for as ``/name``."""
    from gateway.commands.builtin import REGISTRY

    return {name for row in REGISTRY.rows for name in (row.name, *row.aliases)}


def review_lines(scripts: list[str]) -> list[str]:
    if not scripts:
        return ["No scripts or executables in it."]
    return [
        f"Review these {len(scripts)} script(s) before relying on it (the agent may run them):",
        *(f"  {_shown(s, 200)}" for s in scripts),
    ]


def cmd_skills(args: argparse.Namespace) -> int:
    from agent.skill_install import (
        approve_draft,
        download_archive,
        install_archive,
        list_skills,
        remove_skill,
    )
    from agent.skills import SkillError

    cfg = load_config_arg(args)
    settings = cfg.agent.skills
    try:
        if args.action == "list":
            found = list_skills(settings)
            if not found:
                print("no skills")
            for s in found:
                who = f" by {_shown(s.installed_by, 80)}" if s.installed_by else ""
                when = f" on {_shown(s.installed_at, 30)}" if s.installed_at else ""
                origin = f" from {_shown(s.origin, 120)}" if s.origin else ""
                print(f"{s.name}  [{s.source}, {s.state}]{who}{when}{origin}")
                print(f"    {_shown(s.description, DESCRIPTION_CHARS)}")
            return 0
        if args.action == "install":
            source: str = args.source
            if source.startswith(("http://", "https://")):
                data = asyncio.run(download_archive(source, cfg.agent.web.allow_hosts))
            else:
                path = Path(source)
                if not path.is_file():
                    print(f"chital: skills install: {visible(source)} is not a file", file=sys.stderr)
                    return 2
                from agent.skill_archive import MAX_ARCHIVE_BYTES

                with path.open("rb") as fh:
                    data = fh.read(MAX_ARCHIVE_BYTES + 1)
                source = str(path.resolve())
            done = install_archive(
                data,
                settings,
                installed_by=f"cli:{getpass.getuser()}",
                origin=source,
                reserved=reserved_names(),
                replace=args.replace,
            )
            verb = "replaced" if done.replaced else "installed"
            print(
                f"{verb} {done.name}: {done.files} file(s), {done.unpacked_bytes:,} bytes, in "
                f"{visible(str(Path(settings.custom_dir) / done.name))}"
            )
            print(f"    {_shown(done.description, DESCRIPTION_CHARS)}")
            for line in review_lines(done.scripts):
                print(line)
            return 0
        if args.action == "remove":
            what = remove_skill(settings, args.name)
            print(f"removed the {what} {args.name}")
            return 0
        if args.action == "approve":
            skill = approve_draft(settings, args.name, f"cli:{getpass.getuser()}")
            print(f"approved the draft {skill.name}: it is offered from now on")
            return 0
    except (SkillError, OSError) as exc:
        print(f"chital: skills {args.action}: {visible(str(exc))}", file=sys.stderr)
        return 1
    return 2


def add_parser(sub: Any) -> None:
    skills = add_command(
        sub,
        "skills",
        "list, install, remove or approve skills",
        None,
        description="Manage the agent's skills (docs/skills.md): list them with their source, state and"
        " who installed them; install one from a zip or tar.gz archive (checked before anything is"
        " written) into the custom skills folder; remove a custom one; approve a draft the agent wrote."
        " A running daemon picks changes up without a restart.",
    )
    actions = skills.add_subparsers(title="actions", dest="action", required=True, metavar="ACTION")
    add_command(actions, "list", "show every skill: source, state, who installed it", cmd_skills)
    install = add_command(
        actions,
        "install",
        "install a skill from an archive (a file or an http(s) URL)",
        cmd_skills,
        description="Install a skill from a zip or tar.gz archive holding SKILL.md (at the top or in"
        " one folder named after the skill). Refused, with nothing written, when it is too big, has"
        " too many files, links, absolute or '..' paths, or no valid front matter. Lists the"
        " scripts in it for review.",
    )
    install.add_argument("source", metavar="PATH|URL", help="the archive")
    install.add_argument(
        "--replace", action="store_true", help="replace an installed custom skill of the same name"
    )
    remove = add_command(actions, "remove", "remove a custom skill (or a draft)", cmd_skills)
    remove.add_argument("name", metavar="NAME")
    approve = add_command(actions, "approve", "approve a skill the agent drafted", cmd_skills)
    approve.add_argument("name", metavar="NAME")
