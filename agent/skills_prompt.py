"""How the model learns about skills: a listing in the system prompt and the ``load_skill`` tool.

``SkillsListing`` is a ``wrap_model_call`` middleware: it adds no graph node and stores nothing in
the thread's state, so every thread sees the catalog as configured now (a skill disabled in the
config disappears from old threads too). The listing adapts to the tools the model actually has:
with the sandbox's ``read_file`` it points at ``/mnt/skills/<name>/SKILL.md``; without it, at
``load_skill``. The rendered text is cached per catalog generation, so it is byte-identical from
call to call (prompt caches stay warm).
"""

from __future__ import annotations

import logging
from typing import Any

from langchain.agents.middleware import ModelRequest
from langchain_core.messages import SystemMessage
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from agent.rewrite import RequestRewriter
from agent.sandbox.paths import SKILLS
from agent.skills import SKILL_FILE, SkillCatalog, SkillError

log = logging.getLogger(__name__)

LOAD_SKILL = "load_skill"
READ_FILE = "read_file"

_HEADER = """## Skills

Skills are step-by-step playbooks for particular kinds of work, set up by the people who run you. \
Only each skill's name and purpose are listed below; its full instructions are loaded on demand.

- When a request matches a skill's description, load that skill *before* you start, then follow \
its instructions. {how}
- Load only the skills the task needs. A skill already loaded in this conversation need not be \
loaded again.
- {files}
- If a skill names a tool you do not have, skip that step, work with the tools you do have, and \
say what you could not do.

Available skills:"""

_HOW_FILE = (
    f"Read its {SKILL_FILE} with `{READ_FILE}` at the path shown (pass `limit=1000` so you get all "
    f"of it), or call `{LOAD_SKILL}` with the skill's name."
)
_HOW_TOOL = f"Call `{LOAD_SKILL}` with the skill's name."
_FILES_SANDBOX = (
    f"A skill's supporting files (scripts, templates, references) are in its folder under "
    f"`{SKILLS}/<name>/`, which is read-only: run scripts from there, and write results elsewhere."
)
_FILES_TOOL = (
    f"A skill's supporting files (templates, references) can be read with "
    f"`{LOAD_SKILL}(name, file=...)`; the skill lists them."
)


def _tool_name(tool: BaseTool | dict[str, Any]) -> str | None:
    if isinstance(tool, BaseTool):
        return tool.name
    if isinstance(tool, dict):
        name = tool.get("name") or (tool.get("function") or {}).get("name")
        return name if isinstance(name, str) else None
    return None


def _append(message: SystemMessage | None, text: str) -> SystemMessage:
    """``message`` with ``text`` appended as its last paragraph (string or content-block form)."""
    if message is None:
        return SystemMessage(text)
    content = message.content
    if isinstance(content, str):
        return message.model_copy(update={"content": f"{content}\n\n{text}" if content else text})
    return message.model_copy(update={"content": [*content, {"type": "text", "text": f"\n\n{text}"}]})


def render_listing(catalog: SkillCatalog, *, file_tool: bool) -> str:
    """The system-prompt section: names, descriptions and where each body is; never the bodies."""
    lines = [
        _HEADER.format(
            how=_HOW_FILE if file_tool else _HOW_TOOL, files=_FILES_SANDBOX if file_tool else _FILES_TOOL
        )
    ]
    for skill in catalog.skills:
        lines.append(f"- **{skill.name}**: {skill.description}")
        if skill.allowed_tools:
            lines.append(f"  Uses tools: {', '.join(skill.allowed_tools)}")
        if file_tool:
            lines.append(f"  Instructions: `{skill.virtual_path}`")
    return "\n".join(lines)


class SkillsListing(RequestRewriter):
    """Append the skill listing to the system prompt of every model call.

    ``load_skill`` is hidden from the model while no skill is offered, so an empty catalog costs
    nothing in the prompt.
    """

    def __init__(
        self, catalog: SkillCatalog, *, file_tool: str = READ_FILE, load_tool: str = LOAD_SKILL
    ) -> None:
        super().__init__()
        self.catalog = catalog
        self.file_tool = file_tool
        self.load_tool = load_tool
        self._cache: dict[tuple[int, bool], str] = {}
        self._warned = False

    def section(self, *, file_tool: bool) -> str:
        key = (self.catalog.generation, file_tool)
        text = self._cache.get(key)
        if text is None:
            self._cache = {k: v for k, v in self._cache.items() if k[0] == key[0]}
            text = self._cache[key] = render_listing(self.catalog, file_tool=file_tool)
        return text

    def apply(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        # Skills installed, removed or edited on disk since the last look (throttled stat calls;
        # a reload happens only when something changed): no restart needed.
        self.catalog.refresh()
        names = {_tool_name(t) for t in request.tools}
        if not len(self.catalog):
            if self.load_tool in names:
                tools = [t for t in request.tools if _tool_name(t) != self.load_tool]
                return request.override(tools=tools)
            return request
        has_file, has_load = self.file_tool in names, self.load_tool in names
        if not (has_file or has_load):
            if not self._warned:
                self._warned = True
                log.warning(
                    "skills: the model has neither %s nor %s; skills are not offered",
                    self.file_tool,
                    self.load_tool,
                )
            return request
        section = self.section(file_tool=has_file)
        return request.override(system_message=_append(request.system_message, section))


class _LoadSkillArgs(BaseModel):
    name: str = Field(description="The skill's name, as listed under 'Available skills'.")
    file: str | None = Field(
        None,
        description="Optional: a supporting file of the skill, relative to its folder "
        "(e.g. 'reference.md'). Omit it to get the skill's instructions.",
    )


def load_skill_text(catalog: SkillCatalog, name: str, file: str | None = None) -> str:
    """What ``load_skill`` answers; raises ToolException (shown to the model as a tool error)."""
    skill = catalog.get(name.strip())
    if skill is None:
        offered = ", ".join(catalog.names) or "none"
        raise ToolException(f"There is no skill named {name!r}. Available skills: {offered}.")
    if file and file.strip() not in ("", SKILL_FILE, f"./{SKILL_FILE}"):
        try:
            return catalog.read_file(skill.name, file.strip())
        except SkillError as exc:
            raise ToolException(str(exc)) from None
    head = [f"# Skill: {skill.name}", f"Folder in the sandbox: {skill.virtual_dir}/ (read-only)"]
    if skill.files:
        head.append("Supporting files: " + ", ".join(skill.files))
    return "\n".join(head) + "\n\n" + skill.body


def make_load_skill_tool(catalog: SkillCatalog) -> BaseTool:
    """The ``load_skill`` tool over ``catalog``: works with or without a sandbox."""

    def load_skill(name: str, file: str | None = None) -> str:
        return load_skill_text(catalog, name, file)

    async def aload_skill(name: str, file: str | None = None) -> str:
        # In-memory for the body; a supporting file is one small read. No worker thread needed.
        return load_skill_text(catalog, name, file)

    return StructuredTool.from_function(
        func=load_skill,
        coroutine=aload_skill,
        name=LOAD_SKILL,
        description=(
            "Load the full instructions of one of the skills listed in the system prompt, by name. "
            "Do this before starting a task that matches the skill. With `file`, read one of the "
            "skill's supporting text files instead."
        ),
        args_schema=_LoadSkillArgs,
        handle_tool_error=True,
    )
