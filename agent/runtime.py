"""The super-agent, assembled: the lead harness plus sandbox, file and shell tools, sub-agents, skills,
long-term memory, context middleware and the web / file-delivery / MCP tools.

Each piece lives in its own module and is tested there; this module only wires them together from
:class:`~agent.config.AgentSettings`, owns their lifecycle (start in order, close in reverse) and
exposes what the gateway needs: ``run``, ``save_upload``, ``read_output``, ``memory``. It knows no
chat platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from deepagents.backends import CompositeBackend, StateBackend
from deepagents.middleware import FilesystemMiddleware

from agent.acp.tool import PermissionRelay, acp_events, build_acp_tool
from agent.approvals import matches, subagent_guardrail, tool_name, with_approvals
from agent.config import AgentSettings, ModelSpec
from agent.context import build_context_middleware, thread_title
from agent.events import AgentEvent, ApprovalDecision, OutputFile, PlanItem
from agent.harness import Harness
from agent.memory import MemoryService
from agent.middleware import RetryModelCalls
from agent.model import build_chat_model
from agent.plan import PlanMode, plan_events
from agent.safety import GuardrailMiddleware, Redactor, RedactToolResults
from agent.sandbox import SandboxError, SandboxProvider, create_provider
from agent.sandbox.backend import SandboxBackend
from agent.sandbox.files import HostFiles
from agent.sandbox.paths import OUTPUTS, UPLOADS, PathMapper, PathRefused, ThreadDirs
from agent.sandbox.probe import SandboxState, close_quietly, run_probe
from agent.sandbox.quota import release_walkers
from agent.sandbox.routing import ThreadRoutedBackend, bind, unbind
from agent.skill_tools import build_skill_tools, draft_events
from agent.skills import SkillCatalog, build_skills
from agent.skills_prompt import load_skill_text
from agent.subagents import TASK_TOOL, build_subagents, subagent_event_to_status
from agent.tool_output import ToolOutputCap
from agent.tool_search import TOOL_SEARCH, ToolCatalog, build_tool_search
from agent.tools import (
    McpCatalog,
    McpToolsMiddleware,
    build_present_files,
    build_web_tools,
    events_from_custom,
    outputs_resolver,
)
from agent.tools.background import BackgroundStarter, build_background_tools
from agent.tools.clarify import open_choices
from agent.tools.schedule import Scheduler, build_schedule_tools
from agent.tools.search import CITE_PROMPT
from agent.transcript import TranscriptLine, transcript_of
from agent.turn import PLAIN, TurnOptions
from agent.turn_overrides import TurnOverrides
from agent.usage import UsageSink, attach_usage

log = logging.getLogger(__name__)

# deepagents parks oversized tool results and summarised history here; they live in the graph state,
# not in the sandbox (whose backend refuses paths outside /mnt/user-data and /mnt/skills).
_STATE_ROUTES = ("/large_tool_results/", "/conversation_history/")

LEAD_PROMPT = """

## Your workspace
You run tools in a sandbox of your own for this conversation:
- /mnt/user-data/uploads: files the user sent (read them from here)
- /mnt/user-data/workspace: your scratch space
- /mnt/user-data/outputs: files for the user; save deliverables here, then call present_files
- /mnt/skills: read-only skill folders
Use `execute` for shell commands (no network unless the operator enabled it)."""


class AgentRuntime:
    """Owns the harness and everything around it. ``await start()`` before use, ``close()`` after."""

    def __init__(
        self,
        settings: AgentSettings,
        model: ModelSpec,
        data_dir: Path,
        *,
        models: Sequence[ModelSpec] = (),
        usage: UsageSink | None = None,
        database_url: str | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        """``models``: all configured models a conversation may switch to (``TurnOptions.model``);
        ``usage`` receives the token usage of every model call (agent/usage.py); ``database_url``:
        checkpoints and memory in PostgreSQL instead of SQLite files under ``data_dir``;
        ``secrets``: every secret value the process holds (the gateway's tokens, keys, passwords:
        gateway/config/secrets.py), masked in tool results and approval prompts besides the agent's own
        web and MCP credentials."""
        self.settings = settings
        acp_keys = [k for a in settings.acp_agents.values() for k in a.secrets()]
        self.secrets = [*secrets, *settings.web.secrets(), *settings.mcp.secrets(), *acp_keys]
        self.spec = model
        self.models = list(models)
        self.usage = usage
        self.data_dir = data_dir
        self.database_url = database_url
        self.sandbox_root = (
            settings.sandbox.root if settings.sandbox.root.is_absolute() else data_dir / settings.sandbox.root
        )
        self.provider: SandboxProvider | None = None
        self.memory: MemoryService | None = None
        self.harness: Harness | None = None
        self._skills_dir: Path | None = None
        self._sandbox_problem = ""
        self.mcp_tools = ToolCatalog()
        """The MCP servers' tools now: deferred behind ``tool_search`` (agent/tool_search.py) when
        ``agent.tool_search.enabled``; kept current by :attr:`mcp_catalog` (a reload, a server back)."""
        self.mcp_catalog: McpCatalog | None = None
        """The MCP servers' live tools (agent/tools/mcp.py); None without tools."""
        self.scheduler: Scheduler | None = None
        """The gateway's schedules (agent/tools/schedule.py), set before ``start()``; without it
        (the terminal chat) the agent has no schedule tools."""
        self.acp_relay = PermissionRelay()
        """Where coding agents' permission requests go (agent/acp/tool.py); the gateway points
        it at its approval buttons once it exists. Unset: every request is rejected."""
        self.background: BackgroundStarter | None = None
        """The gateway's background tasks (agent/tools/background.py), set before ``start()``; without
        it the lead agent has no ``start_background_task``."""

    # -- what the gateway uses ------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.harness.model_name if self.harness else self.spec.name

    @property
    def mcp(self) -> McpCatalog | None:
        """The MCP catalog ``/mcp`` lists and reloads; None when the agent has no tools."""
        return self.mcp_catalog

    def run(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        text: str,
        files: Sequence[str] = (),
        options: TurnOptions = PLAIN,
    ) -> AsyncIterator[AgentEvent]:
        assert self.harness is not None, "AgentRuntime.start() was not called"
        return self.harness.run(
            thread_id, user_id=user_id, message_id=message_id, text=text, files=files, options=options
        )

    def resume(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        approval_id: str,
        decision: ApprovalDecision,
    ) -> AsyncIterator[AgentEvent]:
        assert self.harness is not None, "AgentRuntime.start() was not called"
        return self.harness.resume(
            thread_id, user_id=user_id, message_id=message_id, approval_id=approval_id, decision=decision
        )

    async def message_count(self, thread_id: str) -> int:
        assert self.harness is not None
        return await self.harness.message_count(thread_id)

    async def open_choices(self, thread_id: str) -> tuple[str, tuple[str, ...]] | None:
        """The question with options the thread ends on, if it does (a press answers only that)."""
        assert self.harness is not None
        snap = await self.harness.require_graph().aget_state({"configurable": {"thread_id": thread_id}})
        return open_choices(snap.values.get("messages", ()))

    async def plan(self, thread_id: str) -> tuple[PlanItem, ...]:
        assert self.harness is not None
        return await self.harness.plan(thread_id)

    async def transcript(
        self, thread_id: str, last: int = 200, mask: Callable[[str], str] | None = None
    ) -> tuple[TranscriptLine, ...]:
        """The thread's last ``last`` messages as readable lines (the console's transcript), each
        text ``mask``-ed before it is cut."""
        assert self.harness is not None
        snap = await self.harness.require_graph().aget_state({"configurable": {"thread_id": thread_id}})
        return transcript_of(snap.values.get("messages", ()), last, mask)

    async def title(self, thread_id: str) -> str | None:
        assert self.harness is not None
        graph = self.harness.require_graph()
        snap = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        return thread_title(snap.values)

    def thread_files(self, thread_id: str) -> HostFiles:
        """The thread's files as its sandbox sees them, opened only through the symlink-safe
        :class:`HostFiles` with the sandbox user's rights (never a plain host path)."""
        if self.provider is not None and (engine := self.provider.files_for(thread_id)) is not None:
            return engine  # the shared Docker mode: the files are on the engine, not here
        dirs = ThreadDirs.for_thread(self.sandbox_root, thread_id, self._skills_dir)
        owner = self.provider.owner_for(thread_id) if self.provider is not None else None
        if not dirs.uploads.is_dir():
            dirs.ensure(owner)
        return HostFiles(PathMapper(dirs), owner)

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        """Store a file a user sent in the thread's uploads; returns the path the agent sees.

        The name is never reused: an existing entry (or a link sandboxed code planted under the
        name the user's file will have) makes it ``name-2.ext``, and no link is followed."""
        files = await asyncio.to_thread(self.thread_files, thread_id)
        # The thread's disk quota and the host's free-space floor hold for users' files too.
        await asyncio.to_thread(files.room, len(data))
        return await asyncio.to_thread(files.create_unique, UPLOADS, name, data)

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        """The bytes of a file the agent presented, for sending to the chat.

        Opened now, at delivery, through the same checks as the agent's own file tools: inside
        the thread's outputs, no link followed at any component, a regular file (checked on the
        open descriptor), at most ``max_bytes``. What was opened is what is sent."""
        virtual = PathMapper.normalize(path)
        if not virtual.startswith(OUTPUTS + "/"):
            raise PathRefused(f"{path!r} is not inside {OUTPUTS}/")
        files = await asyncio.to_thread(self.thread_files, thread_id)
        data = await asyncio.to_thread(files.read_bytes, virtual, max_bytes)
        return OutputFile(posixpath.basename(virtual), data)

    def _refuses_all(self) -> bool:
        """A local provider without bubblewrap (nor ``allow_unsandboxed``): it refuses every
        command with its own reason, so there is nothing to probe."""
        provider = self.provider
        return getattr(provider, "bwrap", "") is None and not getattr(provider, "allow_unsandboxed", True)

    def sandbox_state(self) -> SandboxState:
        """What the start-up probe found (agent/sandbox/probe.py): what ``/status``, the chat
        banner and ``/readyz`` report, rather than whether bubblewrap is installed."""
        s = self.settings.sandbox
        if not self.settings.tools:
            return SandboxState("off", "none (agent.tools: false)")
        if self.harness is None:
            return SandboxState("starting", "not started yet")
        if self.provider is None:
            return SandboxState("failed", f"{s.provider}: {self._sandbox_problem or 'no sandbox provider'}")
        bwrap = getattr(self.provider, "bwrap", "")
        if self._refuses_all():
            return SandboxState("failed", f"local: {self._sandbox_problem}")
        if s.provider == "local" and bwrap is None:
            return SandboxState(
                "unsandboxed", "local, bubblewrap missing: commands run UNSANDBOXED on this host"
            )
        where = f"bubblewrap {bwrap}" if s.provider == "local" else f"image {s.image}"
        if s.provider == "docker" and s.docker.shared:
            return SandboxState(
                "ready", f"docker, {where}, shared engine (files in per-conversation volumes)"
            )
        return SandboxState("ready", f"{s.provider}, {where}, root {self.sandbox_root}")

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        if not s.tools:
            self.harness = Harness(
                s,
                self.spec,
                self.data_dir / "checkpoints.sqlite",
                models=self.models,
                usage=self.usage,
                checkpoint_url=self.database_url,
                redact=Redactor(self.secrets),
            )
            await self.harness.start()
            return
        model = attach_usage(build_chat_model(self.spec, s), self.spec.name, self.usage)
        tools: list[Any] = []
        middleware: list[Any] = []
        sub_middleware: list[Any] = []

        skill_tools, skill_mw, catalog = build_skills(s.skills)
        # Built even with no skill yet: one installed later (agent/skill_install.py) appears in it.
        self._skills_dir = catalog.skills_dir_for_sandbox(self.sandbox_root)
        sandbox_settings = s.sandbox.model_copy(
            update={"root": self.sandbox_root, "skills_dir": self._skills_dir}
        )
        try:
            self.provider = create_provider(sandbox_settings)
            await self.provider.reconcile()
            # One real command: a bwrap that cannot create namespaces, or a root the sandbox uid
            # cannot reach, shows only when something runs (agent/sandbox/probe.py).
            if self._refuses_all():
                self._sandbox_problem = "bubblewrap is not installed: the agent's commands are refused"
                log.error("sandbox provider local is not usable: %s", self._sandbox_problem)
            elif (problem := await run_probe(self.provider)) is not None:
                raise SandboxError(problem)
            self.provider.start_reaper()
        except SandboxError as exc:
            # The agent still chats; its file and shell tools answer with this reason.
            self._sandbox_problem = str(exc)
            if self.provider is not None:
                await close_quietly(self.provider)
                self.provider = None
            log.error("sandbox provider %s is not usable: %s", s.sandbox.provider, exc)

        filesystem = FilesystemMiddleware(
            backend=CompositeBackend(
                default=ThreadRoutedBackend(), routes={route: StateBackend() for route in _STATE_ROUTES}
            ),
            max_execute_timeout=int(s.sandbox.exec_timeout),
        )
        sandbox_tools = list(filesystem.tools)

        if s.memory.enabled:
            db = s.memory.db_path or self.data_dir / "memory.sqlite"
            memory_model = attach_usage(build_chat_model(self.spec, s), self.spec.name, self.usage)
            self.memory = MemoryService(s.memory, memory_model, db_path=db, db_url=self.database_url)
            await self.memory.start()
            middleware.append(self.memory.build_middleware())
            sub_middleware.append(self.memory.build_middleware(for_subagent=True))

        web = build_web_tools(s.web)
        present = build_present_files(outputs_resolver(self.thread_files))
        # MCP tools are never bound at build time: deferred behind tool_search when it is on,
        # else McpToolsMiddleware adds the catalog's current ones to every model call, so /mcp
        # reload and a reconnected server change them live (docs/tools-and-mcp.md).
        self.mcp_catalog = catalog_mcp = McpCatalog(
            s.mcp, token_dir=self.data_dir / "mcp-oauth", redact=Redactor(self.secrets)
        )
        await catalog_mcp.start()
        self.mcp_tools.replace(catalog_mcp.tools())
        catalog_mcp.subscribe(self.mcp_tools.replace)
        denied = s.approvals.deny
        deferral = build_tool_search(s.tool_search, self.mcp_tools, lambda n: matches(n, denied))

        def sub_deferral() -> list[Any]:
            """A sub-agent's own tool_search (agent/tool_search.py); it hides the gated tools
            too, since a sub-agent cannot ask a person (agent/approvals.py)."""
            gated = [*denied, *s.approvals.tools]
            return build_tool_search(s.tool_search, self.mcp_tools, lambda n: matches(n, gated))

        mcp_tools = McpToolsMiddleware(catalog_mcp)
        tools += [*skill_tools, *web, present]
        if s.skills.drafting:  # the lead only: a sub-agent's task text is the lead's, not the user's
            tools += build_skill_tools(s.skills)
        if self.scheduler is not None:
            tools += build_schedule_tools(self.scheduler)
        if s.acp_agents:  # the lead only: permission prompts need a person, sub-agents have none
            tools.append(build_acp_tool(s.acp_agents, self.acp_relay, Redactor(self.secrets)))
        if self.background is not None:  # the lead's only, like the schedule tools
            tools += build_background_tools(self.background)
        secrets = self.secrets
        plan = PlanMode()  # write_todos, the plan in the thread's state (agent/plan.py)
        context = build_context_middleware(s.context, model, secrets=secrets)
        sub_middleware.append(RedactToolResults(secrets))  # the lead's are masked by ToolErrors
        if s.approvals.tools or s.approvals.deny:
            own = [*plan.tools, *(t for m in context for t in getattr(m, "tools", ()))]
            names = [*tools, *sandbox_tools, *own, *catalog_mcp.tools()]
            context = with_approvals(
                context,
                s.approvals,
                [
                    *map(tool_name, names),
                    *([TASK_TOOL] if s.subagents.enabled else []),
                    *([TOOL_SEARCH] if deferral else []),
                ],
                guardrail_timeout=s.context.guardrail_timeout,
            )
            guard = subagent_guardrail(s.approvals)
            sub_middleware.append(GuardrailMiddleware([guard], timeout=s.context.guardrail_timeout))
        middleware += [
            plan,
            *context,
            filesystem,
            *skill_mw,
            *([] if deferral else [mcp_tools]),
            *build_subagents(
                model,
                [*sandbox_tools, *skill_tools, *web],
                s.subagents,
                extra_middleware_for_subagents=[
                    TurnOverrides(lead=False),  # the conversation's model (/model) for sub-agents too
                    *skill_mw,
                    *([] if deferral else [mcp_tools]),  # deferred: per_subagent's tool_search
                    *sub_middleware,
                    RetryModelCalls(max_retries=s.model_retries, initial_delay=s.retry_backoff),
                    ToolOutputCap(),  # a sub-agent's tool results are bounded like the lead's
                ],
                per_subagent=sub_deferral,
            ),
            *deferral,  # innermost: sees the final tool list, hands deferred tools to the ToolNode
        ]
        self.harness = Harness(
            s.model_copy(update={"system_prompt": s.system_prompt + LEAD_PROMPT + CITE_PROMPT}),
            self.spec,
            self.data_dir / "checkpoints.sqlite",
            checkpoint_url=self.database_url,
            extra_tools=tools,
            extra_middleware=middleware,
            turn_scope=self._sandbox_scope,
            custom_events=[events_from_custom, _status_events, plan_events, draft_events, acp_events],
            redact=Redactor(secrets),
            models=self.models,
            usage=self.usage,
            persona_base=s.system_prompt,
            skill_text=lambda name: _skill_text(catalog, name),
        )
        await self.harness.start()

    @contextlib.asynccontextmanager
    async def _sandbox_scope(self, thread_id: str) -> AsyncIterator[None]:
        """Acquire the thread's sandbox and bind it for this turn's file and shell tools."""
        backend: Any
        try:
            if self.provider is None:
                raise SandboxError(self._sandbox_problem or "no sandbox provider")
            sandbox = await self.provider.acquire(thread_id)
            backend = SandboxBackend(
                sandbox,
                timeout=self.settings.sandbox.exec_timeout,
                max_output=self.settings.sandbox.max_output,
            )
        except SandboxError as exc:
            log.error("no sandbox for thread %s: %s", thread_id, exc)
            backend = _Unavailable(str(exc))
        token = bind(backend)
        try:
            yield
        finally:
            unbind(token)
            if self.provider is not None:
                with contextlib.suppress(Exception):
                    await self.provider.release(thread_id)

    async def close(self) -> None:
        if self.mcp_catalog is not None:
            await self.mcp_catalog.close()
        if self.harness is not None:
            await self.harness.close()
        if self.memory is not None:
            await self.memory.close()
        if self.provider is not None:
            await self.provider.close()
        release_walkers()


def _skill_text(catalog: SkillCatalog, name: str) -> str | None:
    """The body of the skill ``/<name>`` asks for; a skill installed a moment ago counts too."""
    catalog.refresh()
    return load_skill_text(catalog, name) if catalog.get(name) else None


def _status_events(part: Any) -> list[AgentEvent]:
    status = subagent_event_to_status(part)
    return [status] if status is not None else []


class _Unavailable(ThreadRoutedBackend):
    """Bound when the thread's sandbox could not start: every tool call says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in ("reason", "id"):
            return object.__getattribute__(self, name)
        reason = object.__getattribute__(self, "reason")

        def refuse(*_: Any, **__: Any) -> Any:
            raise SandboxError(f"the sandbox is not available: {reason}")

        return refuse
