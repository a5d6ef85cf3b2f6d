"""Agent profiles in config (``profiles:``): a model and a persona (system prompt) for the chats and
channels each one names, checked against the configured models and platforms.

Which agent a conversation talks to at run time (its ``/model`` choice over the profile over
``agent.model``), and skills asked for by name, are gateway/intake/profiles.py: they read the store,
which config (the bottom layer) must not import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from gateway.config.platforms import PLATFORMS

if TYPE_CHECKING:
    from gateway.config.schema import Config


def _id_as_str(value: Any) -> Any:
    """YAML reads ``chats: [-100123]`` as a number: take it as the id that was meant."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


class Profile(BaseModel):
    """An agent profile: the default model and system prompt of the chats and channels it names."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """A name from ``models[].name``; unset: ``agent.model``."""
    system_prompt: str | None = Field(None, min_length=1)
    """Replaces ``agent.system_prompt`` in these chats (the tool and workspace instructions stay);
    unset: ``agent.system_prompt``."""
    channels: list[str] = Field(default_factory=list)
    """Platforms (``telegram``, ``slack``, ``discord``, ``lark``) whose every chat uses it, unless a
    profile names the chat itself."""
    chats: list[Annotated[str, BeforeValidator(_id_as_str)]] = Field(default_factory=list)
    """Chats as ``platform:chat_id`` (a Slack channel id, a Telegram group id, ...), threads and
    topics included."""


def check_profiles(profiles: dict[str, Profile], model_names: list[str]) -> None:
    """Cross-field checks pydantic cannot do per field; the message names the field."""
    platforms = [p.name for p in PLATFORMS]
    owner: dict[str, str] = {}
    for name, profile in profiles.items():
        where = f"profiles.{name}"
        if profile.model is not None and profile.model not in model_names:
            raise ValueError(f"{where}.model: {profile.model!r} is not one of models[].name {model_names}")
        for channel in profile.channels:
            if channel not in platforms:
                raise ValueError(f"{where}.channels: {channel!r} is not a platform; use one of {platforms}")
        for chat in profile.chats:
            platform, _, chat_id = chat.partition(":")
            if platform not in platforms or not chat_id:
                raise ValueError(
                    f"{where}.chats: {chat!r} must be 'platform:chat_id' with a platform of {platforms}"
                )
        for key in [*(f"channel {c}" for c in profile.channels), *(f"chat {c}" for c in profile.chats)]:
            if key in owner and owner[key] != name:
                raise ValueError(f"{where}: {key} is already given to profiles.{owner[key]}")
            owner[key] = name


def profile_for(config: Config, platform: str, chat_id: str) -> tuple[str, Profile] | None:
    """The profile the config gives this chat, else its channel, else None."""
    chat = f"{platform}:{chat_id}"
    for name, profile in config.profiles.items():
        if chat in profile.chats:
            return name, profile
    for name, profile in config.profiles.items():
        if platform in profile.channels:
            return name, profile
    return None
