"""deepagents backend over a :class:`Sandbox`, so FilesystemMiddleware's tools (ls, read_file,
write_file, edit_file, delete, glob, grep, execute) work on the thread's virtual paths.

Why not deepagents' ``BaseSandbox``: it implements file tools by shipping Python scripts through
``execute``. Ours act on the host dirs through the path mapper instead: no exec round-trip, the
same behaviour for every provider, and the path checks live in one place.

Paths outside ``/mnt/user-data`` and ``/mnt/skills`` are refused. If the harness keeps
deepagents' offload dirs (``/large_tool_results``, ``/conversation_history``), route them to
another backend with a ``CompositeBackend``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import TypeVar

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)

from ..image_clean import FORMATS, NotShown, clean_image_file
from .base import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, ExecResult, Sandbox
from .files import Entry, HostFiles, TextWindow
from .paths import USER_DATA, PathRefused, SandboxError

T = TypeVar("T")

# Read as base64 so the middleware can hand them to the model as media (deepagents' own list).
_BINARY_SUFFIXES = frozenset(
    ".png .jpeg .jpg .webp .gif .heic .heif .mp4 .mpeg .mov .avi .flv .mpg .webm .wmv .3gpp .mkv "
    ".wav .mp3 .aiff .aac .ogg .flac .pdf .ppt .pptx".split()
)
_MAX_BINARY_READ = 20 * 1024 * 1024
_UNCLEANABLE_IMAGES = frozenset({".heic", ".heif"})
"""Images read_file would otherwise send as they are (an iPhone photo, its EXIF GPS position and
all) but whose metadata cannot be removed here (Pillow decodes no HEIF): refused, not sent raw."""
_UNCLEANABLE_NOTE = (
    "HEIC/HEIF images are not shown to the model as they are (their metadata, such as the GPS "
    "position, cannot be removed here); convert it to JPEG or PNG first (with execute) and read that"
)
TIMEOUT_EXIT_CODE = 124  # what coreutils `timeout` reports; the model knows it


def _iso(ts: float) -> str | None:
    """The time as ISO 8601, or None for one ``datetime`` cannot hold: sandboxed code sets any
    mtime it likes (``touch -d @300000000000`` is year 11476 on tmpfs), and a listing must not
    fail on it."""
    try:
        return datetime.fromtimestamp(ts, UTC).isoformat()
    except (OverflowError, ValueError, OSError):
        return None


def shown(path: str) -> str:
    """A path as the model is shown it. A name that is not UTF-8 (bytes 0xff 0xfe, which sandboxed
    code can give a file) arrives with lone surrogates, which UTF-8 JSON and the checkpoint's
    msgpack both refuse to encode: shown with ``\\xff`` escapes instead (that name does not
    address the file; ``execute`` can)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return path


def _info(e: Entry) -> FileInfo:
    path = shown(e.path)
    info = FileInfo(path=path + "/" if e.is_dir else path, is_dir=e.is_dir, size=e.size)
    if e.modified and (when := _iso(e.modified)) is not None:
        info["modified_at"] = when
    return info


def execute_response(res: ExecResult, timeout: float) -> ExecuteResponse:
    output = res.output
    if res.timed_out:
        output += f"\n[command timed out after {timeout:g}s; it and its child processes were killed]"
        return ExecuteResponse(output=output, exit_code=TIMEOUT_EXIT_CODE, truncated=res.truncated)
    return ExecuteResponse(output=output, exit_code=res.exit_code, truncated=res.truncated)


class SandboxBackend(SandboxBackendProtocol):
    """deepagents ``SandboxBackendProtocol`` over one thread's :class:`Sandbox`.

    Sync methods serve deepagents' sync tool path; file ops are blocking host I/O anyway. Sync
    ``execute`` needs the event loop the sandbox lives on: pass ``loop`` (or build the backend
    inside that loop) when sync tools may run in worker threads.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_output: int = DEFAULT_MAX_OUTPUT,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.timeout = timeout
        self.max_output = max_output
        if loop is None:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
        self._loop = loop

    @property
    def id(self) -> str:
        return self.sandbox.id

    @property
    def files(self) -> HostFiles:
        return self.sandbox.files

    # --- ls ----------------------------------------------------------------------------------

    def ls(self, path: str) -> LsResult:
        try:
            return LsResult(entries=[_info(e) for e in self.files.ls(path)])
        except SandboxError as e:
            return LsResult(error=str(e))

    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    # --- read --------------------------------------------------------------------------------

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        try:
            suffix = PurePosixPath(file_path).suffix.lower()
            if suffix in _BINARY_SUFFIXES:
                raw = self.files.read_bytes(file_path, _MAX_BINARY_READ)
                if suffix in _UNCLEANABLE_IMAGES:
                    return ReadResult(error=f"{file_path}: {_UNCLEANABLE_NOTE}")
                if suffix in FORMATS:  # pixels only to the model provider: no EXIF/GPS, comments, ICC
                    try:
                        raw = clean_image_file(raw, suffix)
                    except NotShown as e:
                        return ReadResult(error=f"{file_path}: {e}")
                encoded = base64.standard_b64encode(raw).decode("ascii")
                return ReadResult(file_data=FileData(content=encoded, encoding="base64"))
            if int(limit) <= 0:
                return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True)
            return _window_result(self.files.read_text(file_path, offset, limit))
        except SandboxError as e:
            return ReadResult(error=str(e))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    # --- write / edit / delete ---------------------------------------------------------------

    def write(self, file_path: str, content: str) -> WriteResult:
        try:
            return WriteResult(path=self.files.write(file_path, content))
        except SandboxError as e:
            return WriteResult(error=str(e))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await asyncio.to_thread(self.write, file_path, content)

    def edit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        try:
            n = self.files.edit(file_path, old_string, new_string, replace_all)
            return EditResult(path=self.files.mapper.normalize(file_path), occurrences=n)
        except SandboxError as e:
            return EditResult(error=str(e))

    async def aedit(
        self,
        file_path: str,
        old_string: str,
        new_string: str,
        replace_all: bool = False,
    ) -> EditResult:
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        try:
            return DeleteResult(path=self.files.delete(file_path))
        except SandboxError as e:
            return DeleteResult(error=str(e))

    async def adelete(self, file_path: str) -> DeleteResult:
        return await asyncio.to_thread(self.delete, file_path)

    # --- glob / grep -------------------------------------------------------------------------

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        try:
            found, truncated = self.files.glob(pattern, path or USER_DATA)
        except SandboxError as e:
            return GlobResult(error=str(e))
        return GlobResult(
            matches=[FileInfo(path=shown(p)) for p in found],
            truncated=truncated,
            truncation_reason="budget" if truncated else None,
        )

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await asyncio.to_thread(self.glob, pattern, path)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        try:
            found, truncated = self.files.grep(pattern, path or USER_DATA, glob, max_count)
        except SandboxError as e:
            return GrepResult(error=str(e))
        matches = [GrepMatch(path=shown(m.path), line=m.line, text=shown(m.text)) for m in found]
        return GrepResult(matches=matches, truncated=truncated)

    # agrep: the protocol's default wraps grep in a thread with its own timeout; that fits.

    # --- execute -----------------------------------------------------------------------------

    def _timeout(self, timeout: int | None) -> float:
        return self.timeout if not timeout or timeout <= 0 else float(timeout)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        t = self._timeout(timeout)
        try:
            res = await self.sandbox.exec(command, timeout=t, max_output=self.max_output)
        except SandboxError as e:
            return ExecuteResponse(output=f"Error: {e}", exit_code=None)
        return execute_response(res, t)

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self._run_sync(lambda: self.aexecute(command, timeout=timeout))

    def _run_sync(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run a coroutine from sync code: on the sandbox's loop when it runs in another thread."""
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError("sync execute() called on the event loop thread; use aexecute()")

            async def wrapper() -> T:
                return await make()

            fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(wrapper(), loop)
            return fut.result()

        async def main() -> T:
            return await make()

        return asyncio.run(main())

    # --- upload / download -------------------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, content in files:
            try:
                self.files.write(path, content)
                out.append(FileUploadResponse(path=path))
            except PathRefused:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
            except SandboxError as e:
                out.append(FileUploadResponse(path=path, error=str(e)))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            try:
                entry = self.files.stat(path)
                if entry is None:
                    out.append(FileDownloadResponse(path=path, error="file_not_found"))
                elif entry.is_dir:
                    out.append(FileDownloadResponse(path=path, error="is_directory"))
                else:
                    content = self.files.read_bytes(path, _MAX_BINARY_READ)
                    out.append(FileDownloadResponse(path=path, content=content))
            except PathRefused:
                out.append(FileDownloadResponse(path=path, error="permission_denied"))
            except SandboxError as e:
                out.append(FileDownloadResponse(path=path, error=str(e)))
        return out


def _window_result(w: TextWindow) -> ReadResult:
    text = w.text.replace("\r\n", "\n").replace("\r", "\n")
    whole = w.start_line <= 1 and w.end_line == w.total_lines
    if w.total_lines == 0 or (whole and not text.strip()):
        # Empty or blank file: no pagination; the middleware shows its empty-file reminder.
        return ReadResult(file_data=FileData(content=text, encoding="utf-8"))
    more = w.total_lines is None or w.end_line < w.total_lines  # None: the read stopped early
    return ReadResult(
        file_data=FileData(content=text, encoding="utf-8"),
        total_lines=w.total_lines,
        start_line=w.start_line,
        end_line=w.end_line,
        next_offset=w.end_line if more else None,
    )
