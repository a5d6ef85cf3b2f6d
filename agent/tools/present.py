"""``present_files``: hand files the agent made in ``/mnt/user-data/outputs`` to the chat.

The tool only checks the paths and announces them; it sends nothing itself (the agent knows no
chat platform). It writes the custom stream event ``{"chital.files": [host paths], "caption": str}``,
which the harness turns into ``FileOut`` events with :func:`files_from_custom`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.config import get_stream_writer
from pydantic import BaseModel, Field

from agent.events import FileOut
from agent.sandbox.paths import OUTPUTS, PathMapper, PathRefused, ThreadDirs

FILES_EVENT = "chital.files"
"""Key of the custom stream event carrying host paths of files to deliver."""

MAX_FILES = 20

OutputsResolver = Callable[[str, str], Path]
"""(thread id, path the model gave) -> host path of an existing regular file inside the thread's
outputs dir; raises ``PathRefused`` (text safe to show the model) otherwise."""


def outputs_resolver(sandbox_root: Path | str) -> OutputsResolver:
    """The resolver for the sandbox layout under ``sandbox_root`` (``SandboxSettings.root``).

    A bare or relative name means a file in the outputs dir (``report.pdf`` ->
    ``/mnt/user-data/outputs/report.pdf``): that is where the model was told to put deliverables.
    """

    def resolve(thread_id: str, path: str) -> Path:
        mapper = PathMapper(ThreadDirs.for_thread(sandbox_root, thread_id, None))
        if isinstance(path, str) and path and not path.startswith("/"):
            path = posixpath.join(OUTPUTS, path)
        virtual = mapper.normalize(path)
        if not virtual.startswith(OUTPUTS + "/"):
            raise PathRefused(f"{path!r} is not inside {OUTPUTS}/; save the file there first")
        host = mapper.resolve(virtual).host
        if not host.is_file():
            raise PathRefused(f"{virtual} does not exist or is not a regular file")
        return host

    return resolve


class _PresentArgs(BaseModel):
    paths: list[str] = Field(
        description=f"Files to send, each inside {OUTPUTS}/ (e.g. {OUTPUTS}/report.pdf).",
        min_length=1,
    )
    caption: str = Field("", description="Optional short text sent with the files.")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def build_present_files(resolve: OutputsResolver) -> BaseTool:
    """The ``present_files`` tool over ``resolve`` (see :func:`outputs_resolver`).

    All paths are checked before anything is announced: a call either delivers every file or
    none, so the model can fix the list and call again without sending duplicates.
    """

    async def present_files(paths: list[str], runtime: ToolRuntime, caption: str = "") -> str:
        thread_id = str((runtime.config.get("configurable") or {}).get("thread_id") or "")
        if not thread_id:
            raise ToolException("present_files needs a conversation thread")
        if len(paths) > MAX_FILES:
            raise ToolException(f"at most {MAX_FILES} files per call")
        hosts: list[Path] = []
        problems: list[str] = []
        for path in dict.fromkeys(paths):
            try:
                hosts.append(resolve(thread_id, path))
            except PathRefused as exc:
                problems.append(str(exc))
        if problems:
            raise ToolException("nothing was sent: " + "; ".join(problems))
        get_stream_writer()({FILES_EVENT: [str(h) for h in hosts], "caption": caption})
        listing = ", ".join(f"{h.name} ({_size(h.stat().st_size)})" for h in hosts)
        return f"Sent to the chat: {listing}."

    return StructuredTool.from_function(
        coroutine=present_files,
        name="present_files",
        description=(
            f"Send files you created to the user in the chat. Save them under {OUTPUTS}/ first. "
            "Call it once with all the files; do not paste the file contents into your answer."
        ),
        args_schema=_PresentArgs,
        handle_tool_error=True,
    )


def files_from_custom(part: Any) -> list[FileOut]:
    """FileOut events for a custom stream part, or [] when it is not a files event."""
    if not isinstance(part, dict) or FILES_EVENT not in part:
        return []
    caption = str(part.get("caption") or "")
    return [FileOut(Path(p), caption if i == 0 else "") for i, p in enumerate(part[FILES_EVENT] or ())]
