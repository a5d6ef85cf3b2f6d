"""config.yaml: a pydantic schema, ``$ENV_VAR`` references, and errors that name the field."""

from __future__ import annotations

import os
import re
import shlex
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    model_validator,
)

from agent.config import AgentSettings, ModelSpec
from agent.settings import shipped_skills_dir
from channels.settings import ChannelSettings
from gateway.config.console import ConsoleConfig
from gateway.config.hooks import HooksConfig
from gateway.config.platforms import PLATFORMS, platform_named
from gateway.config.profiles import Profile, check_profiles
from gateway.config.push import PushTarget, check_target_names
from gateway.config.sections import (
    AccessPolicy,
    BackgroundConfig,
    BusyMode,
    ConcurrencyConfig,
    ContextConfig,
    DeliveryConfig,
    HttpConfig,
    LimitsConfig,
    SchedulesConfig,
    SpeechConfig,
    StorageConfig,
    Strict,
    TranscriptionConfig,
    UsageConfig,
)
from gateway.config.tracing import TracingConfig

_ENV_REF = re.compile(r"\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(?(1)\})")

HTTP_HOST_ENV = "CHITAL_HTTP_HOST"
"""When set, replaces ``http.host`` (from the file or the default). The container image sets it to
``0.0.0.0`` so a published port answers; a daemon on a host keeps listening on 127.0.0.1 only."""


class ConfigError(Exception):
    """config.yaml is unreadable or invalid. The message names the file and the field."""


class ChannelBase(Strict):
    enabled: bool = True
    access: AccessPolicy | None = None
    """Overrides the top-level ``access`` for this channel."""
    context: ContextConfig | None = None
    """Overrides the top-level ``context`` for this channel."""
    busy_mode: BusyMode = "queue"
    """What a message does when it arrives while a turn runs in its conversation: ``queue`` waits
    for the turn and is answered after it; ``interrupt`` stops the turn and is answered with the
    stopped message as context; ``steer`` is given to the running turn at its next model call.
    An admin's ``/busy`` sets it per conversation; ``/queue``, ``/steer`` and ``/interrupt`` before
    a message set it for that message (docs/steering.md)."""


def _channel_section(settings: type[ChannelSettings]) -> type[ChannelBase]:
    """``channels.<platform>``: the platform's own settings (channels/<platform>/settings.py) plus
    ``enabled`` and ``access``, documented by the settings model's docstrings."""
    bases: tuple[type[BaseModel], ...] = (settings, ChannelBase)
    section = create_model(
        settings.__name__.removesuffix("Settings") + "Config",
        __base__=bases,
        __doc__=settings.__dict__.get("__doc__"),
        __module__=__name__,
    )
    return cast(type[ChannelBase], section)


def _off(section: type[ChannelBase], on: bool = False) -> Callable[[], ChannelBase]:
    return lambda: section(enabled=on)


def _channels_config() -> type[Strict]:
    """The ``channels`` section: one key per platform of gateway/config/platforms.py, off when absent."""
    sections = {p.name: _channel_section(p.settings) for p in PLATFORMS}
    on = {p.name: p.on_by_default for p in PLATFORMS}
    fields: dict[str, Any] = {n: (s, Field(default_factory=_off(s, on[n]))) for n, s in sections.items()}
    return create_model("ChannelsConfig", __base__=Strict, __module__=__name__, **fields)


if TYPE_CHECKING:

    class ChannelsConfig(Strict):
        def __getattr__(self, name: str) -> Any: ...

else:
    ChannelsConfig = _channels_config()


class Config(Strict):
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()])
    agent: AgentSettings = Field(default_factory=AgentSettings)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    access: AccessPolicy = Field(default_factory=AccessPolicy)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    context: ContextConfig = Field(default_factory=ContextConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    transcription: TranscriptionConfig = Field(default_factory=TranscriptionConfig)
    speech: SpeechConfig = Field(default_factory=SpeechConfig)
    """Spoken replies (``/voice``): an OpenAI-compatible ``/audio/speech`` endpoint (docs/speech.md)."""
    schedules: SchedulesConfig = Field(default_factory=SchedulesConfig)
    tasks: BackgroundConfig = Field(default_factory=BackgroundConfig)
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    """Background tasks: `/bg`, `/tasks`, the agent's `start_background_task` (docs/background-tasks.md)."""
    profiles: dict[str, Profile] = Field(default_factory=dict)
    """Agent profiles: a model and a system prompt for the chats and channels each one names
    (docs/models-and-usage.md)."""
    usage: UsageConfig = Field(default_factory=UsageConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    """OpenTelemetry traces of every turn, Langfuse (docs/tracing.md)."""
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    """The operator console on the HTTP listener, behind a login (docs/console.md)."""
    push: dict[str, PushTarget] = Field(default_factory=dict)
    """Push-only notification targets (Bark, ntfy) by name, for ``chital send push:NAME`` and
    schedules (docs/push.md)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    _source: Path | None = PrivateAttr(default=None)
    """The file this was read from (absolute), for the commands the bot tells people to run."""

    @property
    def source(self) -> Path | None:
        return self._source

    @source.setter
    def source(self, path: Path | None) -> None:
        self._source = path

    def cli(self) -> str:
        """``chital -c /abs/config.yaml``: the command prefix that acts on this daemon's data from
        any directory (bare ``chital`` when it runs on the built-in defaults)."""
        return f"chital -c {shlex.quote(str(self._source))}" if self._source is not None else "chital"

    @model_validator(mode="after")
    def _model_exists(self) -> Config:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model names {names}")
        if self.agent.model not in names:
            raise ValueError(f"agent.model: {self.agent.model!r} is not one of models[].name {names}")
        check_profiles(self.profiles, names)
        check_target_names(self.push)
        unknown = sorted(set(self.usage.prices) - set(names))
        if unknown:
            raise ValueError(f"usage.prices: {unknown} are not models[].name ({names})")
        unpriced = [n for n in names if n not in self.usage.prices]
        if unpriced and (self.usage.daily_cost or any(self.usage.user_costs.values())):
            raise ValueError(
                f"usage.daily_cost / user_costs: a money budget needs a price for every model; "
                f"usage.prices has none for {unpriced}"
            )
        return self

    def model_spec(self, name: str | None = None) -> ModelSpec:
        wanted = name or self.agent.model
        return next(m for m in self.models if m.name == wanted)

    def access_for(self, channel: str) -> AccessPolicy:
        specific = getattr(self.channels, channel).access
        if specific is not None:
            return specific
        row = platform_named(channel)
        return row.default_access if row is not None and row.default_access is not None else self.access

    def context_for(self, channel: str) -> ContextConfig:
        specific = getattr(self.channels, channel).context
        return specific if specific is not None else self.context


def _resolve_env(node: Any, path: str, missing: list[str]) -> Any:
    """Replace ``$VAR`` / ``${VAR}`` in strings. An unset variable becomes ``None`` when it is the
    whole value (so a channel without its token is simply off) and is reported otherwise."""
    if isinstance(node, dict):
        # A key whose whole value is an unset $VAR is dropped, so the field's default applies
        # (a channel without its token is simply off; a base URL falls back to the platform's).
        out = {k: _resolve_env(v, f"{path}.{k}" if path else str(k), missing) for k, v in node.items()}
        return {k: v for k, v in out.items() if not (v is None and isinstance(node[k], str))}
    if isinstance(node, list):
        return [_resolve_env(v, f"{path}[{i}]", missing) for i, v in enumerate(node)]
    if isinstance(node, str) and "$" in node:
        whole = _ENV_REF.fullmatch(node)
        if whole:
            return os.environ.get(whole.group(2)) or None

        def sub(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(2))
            if value is None:
                missing.append(f"{path}: environment variable {m.group(2)} is not set")
                return ""
            return value

        return _ENV_REF.sub(sub, node)
    return node


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold: itself, a union's members, ``Annotated``'s base."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return models_in(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """Keys the schema accepts in the mapping at ``loc`` (empty when it cannot tell), to suggest the
    one a typo meant. Follows fields, list items and dict values through ``Config``'s annotations."""
    annotation: Any = Config
    for part in loc:
        models = models_in(annotation)
        named = [m for m in models if m.__name__ == part]
        if named:  # pydantic names the union member in the location
            annotation = named[0]
            continue
        if models:
            fields = [m.model_fields[str(part)] for m in models if str(part) in m.model_fields]
            if not fields:
                return []
            annotation = fields[0].annotation
            continue
        args = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (list, tuple, dict) and args:
            annotation = args[-1]  # list[X] / tuple[X, ...] item, dict[str, X] value
        elif args:
            annotation = args[0]  # X | None
        else:
            return []
    return sorted({name for m in models_in(annotation) for name in m.model_fields})


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line in the YAML source of the key (or item) at ``loc``, if the file has it."""
    line: int | None = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next((kv for kv in node.value if str(kv[0].value) == str(part)), None)
            if pair is None:
                return line
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _describe(err: Any, node: yaml.Node | None) -> str:
    """One error line: the field path, its line in the file, and for an unknown key the closest
    known key. Never the offending value: it may be a secret."""
    loc = tuple(err["loc"])
    line = _line_of(node, loc)
    where = _field_path(loc) + (f" (line {line})" if line else "")
    if err["type"] != "extra_forbidden":
        return f"  {where}: {err['msg']}"
    known = _known_keys(loc[:-1])
    import difflib  # only for a config error: not loaded by a daemon that starts

    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = f"; known keys: {', '.join(known)}" if known else ""
    if close:
        hint = f"; did you mean {close[0]!r}?"
    return f"  {where}: unknown key{hint}"


def parse_config(data: Any, source: str = "config.yaml", node: yaml.Node | None = None) -> Config:
    """Validate ``data`` (the parsed YAML). ``node``, the composed YAML document, lets errors give
    line numbers."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    missing: list[str] = []
    resolved = _resolve_env(data, "", missing)
    if missing:
        raise ConfigError(f"{source}: " + "; ".join(missing))
    try:
        cfg = Config.model_validate(resolved)
    except ValidationError as exc:
        lines = [_describe(err, node) for err in exc.errors()]
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None
    host = os.environ.get(HTTP_HOST_ENV, "").strip()
    if host:
        cfg.http.host = host
    return cfg


def builtin_defaults() -> dict[str, Any]:
    """What stands in for config.yaml when there is none: the example file's ``$VAR`` references.
    A channel whose credentials are in the environment is on (with the default access policy:
    strangers get a pairing code), one without them reports which variable to set; the model is
    ``$CHITAL_MODEL`` at ``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY``; data in ``$CHITAL_DATA``,
    else ./data."""
    return {
        "models": [
            {
                "name": "default",
                "use": "langchain_openai:ChatOpenAI",
                "model": "$CHITAL_MODEL",
                "base_url": "$OPENAI_BASE_URL",
                "api_key": "$OPENAI_API_KEY",
            }
        ],
        "channels": {p.name: {f: f"${env}" for f, env in p.settings.required.items()} for p in PLATFORMS},
        "storage": {"path": "$CHITAL_DATA"},
    }


def load_config(path: str | Path | None) -> Config:
    """Load ``path``; ``None`` (no file found) gives :func:`builtin_defaults`."""
    if path is None:
        return parse_config(builtin_defaults(), "built-in defaults")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: no such file")
    try:
        # Composed first, then constructed: the node tree keeps line numbers for error messages.
        loader = yaml.SafeLoader(p.read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    cfg = parse_config(data, str(p), node)
    cfg.source = p.resolve()
    # Relative paths in the file mean "beside this file", wherever the daemon is started from.
    base = p.parent
    if not cfg.storage.path.is_absolute():
        cfg.storage.path = (base / cfg.storage.path).resolve()
    skills = cfg.agent.skills
    resolved: dict[str, Path] = {}
    for field in ("public_dir", "custom_dir"):
        value = getattr(skills, field)
        if value is not None and not value.is_absolute():
            resolved[field] = (base / value).resolve()
    beside = (base / "skills" / "public").resolve()
    if skills.public_dir is None and not shipped_skills_dir().is_dir() and beside.is_dir():
        resolved["public_dir"] = beside  # an installed wheel: the Docker image's /app/skills/public
    # Rebuilt with the same fields-set: a folder the file names is missing with a warning, one
    # it leaves to the default is not (agent/skills.py).
    cfg.agent.skills = type(skills).model_construct(
        set(skills.model_fields_set), **{**dict(skills), **resolved}
    )
    return cfg
