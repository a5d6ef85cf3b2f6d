"""What agent a conversation talks to at run time: its model, its persona (system prompt), a skill asked for.

Three layers decide a turn's model and persona, the first that says something wins:

1. the conversation's own choice (``/model NAME``; the ``conversation_models`` table, so it
   survives restarts and ``/new``);
2. the profile the config gives the chat or its channel (``profiles:``; a chat's profile wins over
   its channel's);
3. ``agent.model`` and ``agent.system_prompt``.

A persona replaces ``agent.system_prompt`` only: the agent's tool, workspace, skill and memory
sections stay. ``/<skill> text`` activates a skill for one turn; skills are read from the same
folders and settings as the agent's (``agent.skills``), and a skill whose name is a built-in
command is not reachable that way (the command wins).

The profiles themselves are config (gateway/config/profiles.py).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent.settings import SkillsSettings
from agent.skills import Skill, SkillCatalog
from agent.turn import TurnOptions
from gateway.config.profiles import Profile, profile_for

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.config.schema import Config
    from gateway.intake.host import IntakeHost
    from gateway.store.entries import JournalEntry
    from gateway.store.journal import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InUse:
    """The agent a conversation talks to now (``/status``, ``/model``, each turn)."""

    model: str
    default_model: str
    """The model without a ``/model`` choice (the profile's, else ``agent.model``)."""
    profile: str | None
    persona: str | None
    chosen: bool
    """True when ``/model`` picked :attr:`model`."""


async def in_use(config: Config, store: Store, inbound: Inbound, chosen_any: bool = True) -> InUse:
    """``chosen_any``: False when the caller knows no ``/model`` choice is recorded (no read)."""
    found = profile_for(config, inbound.platform, inbound.chat_id)
    name, profile = found if found else (None, Profile())
    default = profile.model or config.agent.model
    chosen = await store.chosen_model(inbound.conversation) if chosen_any else None
    names = [m.name for m in config.models]
    if chosen is not None and chosen not in names:
        log.warning(
            "conversation %s chose model %r, which is no longer configured", inbound.conversation, chosen
        )
        chosen = None
    return InUse(
        model=chosen or default,
        default_model=default,
        profile=name,
        persona=profile.system_prompt,
        chosen=chosen is not None,
    )


# -- skills on demand --------------------------------------------------------------------------------
_SKILL_COMMAND = re.compile(r"^/([A-Za-z0-9][A-Za-z0-9_-]{0,63})(?:@\S+)?(?:\s|$)")


@functools.cache
def _catalog(
    public_dir: Path,
    custom_dir: Path,
    enabled: tuple[str, ...] | None,
    disabled: tuple[str, ...],
    configured: frozenset[str] = frozenset(),
    reload_seconds: float = 2.0,
) -> SkillCatalog:
    settings = SkillsSettings.model_construct(
        set(configured),  # which folders the config names: only those are missing with a warning
        reload_seconds=reload_seconds,
        public_dir=public_dir,
        custom_dir=custom_dir,
        enabled=list(enabled) if enabled is not None else None,
        disabled=list(disabled),
    )
    return SkillCatalog(settings)


def _current(config: Config) -> SkillCatalog:
    s = config.agent.skills
    enabled = tuple(s.enabled) if s.enabled is not None else None
    fields = frozenset(s.model_fields_set)
    return _catalog(s.public(), Path(s.custom_dir), enabled, tuple(s.disabled), fields, s.reload_seconds)


def skills(config: Config) -> list[Skill]:
    """The skills the agent offers (none when ``agent.tools`` is off), re-read when the folders change."""
    if not config.agent.tools:
        return []
    catalog = _current(config)
    catalog.refresh()  # installed or removed since: throttled stat calls (agent/skills.py)
    return catalog.skills


def reload_skills(config: Config) -> None:
    """Re-read the skill folders now (after an install or removal in chat), not at the next look."""
    if config.agent.tools:
        _current(config).reload()


def command_name(skill: str) -> str:
    """How a skill is called in chat: ``/data_analysis`` (Telegram commands take no hyphen);
    ``/data-analysis`` works too."""
    return skill.replace("-", "_")


def skill_for(config: Config, text: str) -> str | None:
    """The skill that ``/<skill> text`` names, or None.

    Built-in commands are never skills, and that is decided before this is asked: intake parses
    the command registry's names first (gateway/commands/builtin.py) and journals them as commands,
    so a turn's text never starts with one (a schedule's firing starts with its header). So this
    needs no list of the commands, and does not import the command layer above it."""
    match = _SKILL_COMMAND.match(text.strip())
    if match is None:
        return None
    wanted = match.group(1).lower().replace("_", "-")
    return next((s.name for s in skills(config) if s.name == wanted), None)


# -- the turn ------------------------------------------------------------------------------------
async def conversation_options(
    gateway: IntakeHost, entry: JournalEntry, options: TurnOptions, chosen_any: bool = True
) -> TurnOptions:
    """``options`` with the conversation's model and persona and the skill the message asks for
    (``chosen_any``: as :func:`in_use`'s)."""
    now = await in_use(gateway.config, gateway.store, entry.inbound, chosen_any)
    model = now.model if now.model != gateway.config.agent.model else None
    skill = skill_for(gateway.config, entry.inbound.text)
    if model is None and now.persona is None and skill is None:
        return options
    return replace(options, model=model, system_prompt=now.persona, skill=skill)
