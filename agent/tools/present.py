"""``present_files``: hand files the agent made in ``/mnt/user-data/outputs`` to the chat.

The tool only checks the paths and announces them; it sends nothing itself (the agent knows no
chat platform). It writes the custom stream event ``{"chital.files": [virtual paths], "caption": str}``,
which the harness turns into ``FileOut`` events with :func:`files_from_custom`.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable
from typing import Any

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.config import get_stream_writer
from pydantic import BaseModel, Field

from agent.events import FileOut
from agent.sandbox.files import HostFiles
from agent.sandbox.paths import OUTPUTS, PathMapper, PathRefused, SandboxError
from agent.untrusted import file_name

FILES_EVENT = "chital.files"
"""Key of the custom stream event carrying the virtual paths of files to deliver."""

MAX_FILES = 20

OutputsResolver = Callable[[str, str], tuple[str, int]]
"""(thread id, path the model gave) -> (virtual path, size) of a regular file inside the thread's
outputs dir; raises ``PathRefused`` or ``SandboxError`` (text safe to show the model) otherwise."""


def outputs_resolver(files_for: Callable[[str], HostFiles]) -> OutputsResolver:
    """The resolver over ``files_for(thread_id)``, the thread's symlink-safe file operations.

    A bare or relative name means a file in the outputs dir (``report.pdf`` ->
    ``/mnt/user-data/outputs/report.pdf``): that is where the model was told to put deliverables.
    The check here only helps the model fix its call; the file is opened again, just as safely,
    when it is sent (it may have changed in between).
    """

    def resolve(thread_id: str, path: str) -> tuple[str, int]:
        if isinstance(path, str) and path and not path.startswith("/"):
            path = posixpath.join(OUTPUTS, path)
        virtual = PathMapper.normalize(path)
        if not virtual.startswith(OUTPUTS + "/"):
            raise PathRefused(f"{path!r} is not inside {OUTPUTS}/; save the file there first")
        # Refuses a link that leads out (with a clear message), then checks the opened file.
        return virtual, files_for(thread_id).regular_size(virtual)

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
        found: list[tuple[str, int]] = []
        problems: list[str] = []
        for path in dict.fromkeys(paths):
            try:
                found.append(await asyncio.to_thread(resolve, thread_id, path))
            except SandboxError as exc:
                problems.append(str(exc))
        if problems:
            raise ToolException("nothing was sent: " + "; ".join(problems))
        get_stream_writer()({FILES_EVENT: [v for v, _ in found], "caption": caption})
        # The names as the chat shows them (gateway/intake/attachments.py): invisible characters gone.
        listing = ", ".join(f"{file_name(posixpath.basename(v))} ({_size(n)})" for v, n in found)
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
    return [FileOut(str(p), caption if i == 0 else "") for i, p in enumerate(part[FILES_EVENT] or ())]
