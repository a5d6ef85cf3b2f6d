"""A scriptable fake of the OpenAI Chat Completions API (aiohttp on 127.0.0.1, free port).

Tests drive the real ``openai`` / ``langchain-openai`` clients against it. Benchmarks use it as an
"instant model", so the hot path builds each response with one ``json.dumps`` per chunk and a single
socket write when no delays are scripted.

    async with FakeOpenAI() as fake:
        fake.script(Reply(text="hi"), Reply(status=429, retry_after=1))
        ChatOpenAI(base_url=fake.base_url, api_key="k", model="m")

    fake = FakeOpenAI.start_in_thread()   # for code that is not async
    ...; fake.stop()

Which reply answers a request: the scripted queue first (in order), then the first matching rule
(``add_rule``), then the default ``echo: <last user text>``. Like the real API, a request whose
assistant ``tool_calls`` are not all answered by ``tool`` messages gets HTTP 400.
Standalone (benchmarks): ``python -m tests.fakes.openai_server [--demo-rules] [--summaries]`` prints
its base URL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from aiohttp import web

from tests.fakes import audio

EXTRACTION_MARKER = "MEMORY EXTRACTION"
"""How agent/memory/extraction.py starts its request (tests/test_fake_openai.py holds them equal);
written out so the fake imports nothing of the agent."""

SUMMARY_MARKER = "Context Extraction Assistant"
"""What the summary prompt of deepagents (LangChain's) starts with (tests/test_long_thread.py holds
them equal): ``--summaries`` answers it with :data:`SUMMARY_TEXT`."""
SUMMARY_TEXT = ("The user greeted the assistant many times and was answered each time. " * 20).strip()
"""A summary of a real summary's size (~1.4 KB); the echo of a summary prompt would be the whole
history the prompt quotes, which no model answers with."""

ReplyFactory = Callable[[dict[str, Any]], "Reply"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the fake model asks for. ``arguments`` may be a dict or a raw JSON string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Heard:
    """One scripted answer of ``/audio/transcriptions``: the text, or an error ``status``
    (500, 413 ...), after ``delay`` seconds (longer than the client's timeout: a timeout)."""

    text: str = ""
    status: int = 200
    delay: float = 0.0
    raw: bytes | None = None
    """Sent as the body instead of ``{"text": ...}``, as ``application/json`` (broken JSON, a huge
    answer)."""
    gate: asyncio.Event | None = None
    """Held until this event is set (a stalled transcriber the test releases when it chooses)."""


@dataclass(frozen=True, slots=True)
class Spoken:
    """One scripted answer of ``/audio/speech``: real audio in the format asked for (Ogg Opus or
    MP3, tests/fakes/audio.py) unless ``status`` is an error, ``raw`` replaces the body (garbage,
    empty, huge) or ``delay`` outlasts the client's timeout."""

    status: int = 200
    delay: float = 0.0
    raw: bytes | None = None
    content_type: str | None = None
    """The response's ``Content-Type``; default the format's (``audio/ogg``, ``audio/mpeg``)."""
    error_body: str = ""
    """An error answer's message (to show it never reaches the chat verbatim)."""
    gate: asyncio.Event | None = None
    """Held until this event is set (a test kills the daemon while the audio is on its way)."""
    location: str | None = None
    """Answer ``307 Temporary Redirect`` to this URL instead (a service sending the text elsewhere)."""
    trickle: float | None = None
    """Stream a chunked body of a few real audio bytes every this many seconds, never ending."""
    declared: int | None = None
    """Declare this ``Content-Length``, send the first bytes of real audio and then nothing more."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer.

    ``status`` != 200 answers with an OpenAI-shaped error body (and ``Retry-After`` when given).
    ``first_byte_delay`` holds back the response headers (a client read timeout fires on it);
    ``chunk_delay`` paces the streamed chunks.
    """

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    chunks: int = 3
    status: int = 200
    retry_after: float | None = None
    error_message: str = ""
    first_byte_delay: float = 0.0
    chunk_delay: float = 0.0
    finish_reason: str | None = None
    drop_after: int | None = None
    """Streaming only: cut the connection after this many content pieces (a proxy or server dying)."""
    usage: tuple[int, int] | None = None
    """(prompt, completion) tokens the response reports (in ``usage``: the body's, or the last
    stream chunk's when ``stream_options.include_usage`` asks); default 10 and len(text) // 4."""
    cached: int = 0
    """Of the prompt tokens, how many the response says were read from the provider's cache
    (``usage.prompt_tokens_details.cached_tokens``, as OpenAI reports it)."""
    hold: asyncio.Event | None = None
    """Nothing is answered until the test sets this event: a model whose first text takes exactly
    as long as the test needs (no timing guesses on a loaded machine)."""


def last_user_text(body: dict[str, Any]) -> str:
    """Text of the last ``user`` message of a request (string or content-part list)."""
    for message in reversed(body.get("messages") or ()):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return ""
    return ""


def _split(text: str, parts: int) -> list[str]:
    if not text:
        return []
    parts = max(1, min(parts, len(text)))
    step = -(-len(text) // parts)
    return [text[i : i + step] for i in range(0, len(text), step)]


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


class FakeOpenAI:
    """The fake server. Thread-safe enough for scripting from another thread (deque, list append)."""

    def __init__(self, *, record: bool = True) -> None:
        self.requests: list[dict[str, Any]] = []
        self.transcriptions: list[dict[str, Any]] = []
        """Each ``/audio/transcriptions`` call: model, file name, its bytes, language, Authorization."""
        self.heard: deque[Heard] = deque()
        """Scripted transcription answers, in order; then ``default_transcript``."""
        self.default_transcript = "please book a table for two at seven"
        self.speech: list[dict[str, Any]] = []
        """Each ``/audio/speech`` call: its JSON body (model, voice, input, response_format) and
        Authorization."""
        self.spoken: deque[Spoken] = deque()
        """Scripted speech answers, in order; then real audio of the format asked for."""
        self.record = record
        self.report_usage = True
        """False: responses carry no ``usage`` at all (some OpenAI-compatible servers send none)."""
        self.base_url = ""
        self._queue: deque[Reply] = deque()
        self._rules: list[tuple[Callable[[str], bool], ReplyFactory | Reply]] = []
        self._ids = count(1)
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- scripting -------------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Queue replies; each request consumes one, in order."""
        self._queue.extend(replies)

    def add_rule(self, predicate: Callable[[str], bool], reply: ReplyFactory | Reply) -> None:
        """When the queue is empty: ``predicate(last user text)`` selects ``reply`` (or ``reply(body)``)."""
        self._rules.append((predicate, reply))

    def add_demo_rules(self) -> None:
        """Rules the end-to-end tests and benchmarks share: LONG, SLOW and FAIL429 in the user text."""
        long_text = _long_answer()
        self.add_rule(lambda t: "FAIL429" in t, Reply(status=429, retry_after=1))
        self.add_rule(lambda t: "LONG" in t, Reply(text=long_text, chunks=40))
        self.add_rule(
            lambda t: "SLOW" in t,
            lambda body: Reply(text=f"slow echo: {last_user_text(body)} " * 4, chunks=60, chunk_delay=0.5),
        )

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        return len(self._queue)

    def _choose(self, body: dict[str, Any]) -> Reply:
        # A memory extraction runs in the background a moment after a user's turn, whenever the
        # machine gets to it: taking the next scripted reply, it would steal the one a test queued
        # for its next turn (seen in a loaded CI run). Extractions are answered by rules only.
        background = last_user_text(body).startswith(EXTRACTION_MARKER)
        if self._queue and not background:
            try:
                return self._queue.popleft()
            except IndexError:  # raced with another request
                pass
        if self._rules:
            text = last_user_text(body)
            for predicate, reply in self._rules:
                if predicate(text):
                    return reply if isinstance(reply, Reply) else reply(body)
        return Reply(text=f"echo: {last_user_text(body)}")

    # ---- lifecycle ---------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_post("/v1/audio/speech", self._speech)
        return app

    async def start(self, port: int = 0) -> FakeOpenAI:
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]  # aiohttp exposes no public getter
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @classmethod
    def start_in_thread(cls, *, record: bool = True, port: int = 0) -> FakeOpenAI:
        """Run the server on its own event loop in a daemon thread; call ``stop()`` when done."""
        fake = cls(record=record)
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            fake._loop = loop
            try:
                loop.run_until_complete(fake.start(port))
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(fake.aclose())
            loop.close()

        fake._thread = threading.Thread(target=serve, name="fake-openai", daemon=True)
        fake._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return fake

    def stop(self) -> None:
        """Stop a server started with ``start_in_thread``."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    # ---- handlers ----------------------------------------------------------------------------
    async def _transcriptions(self, request: web.Request) -> web.Response:
        """OpenAI's speech-to-text: multipart ``file`` and ``model`` (``language`` optional)."""
        form = await request.post()
        upload = form.get("file")
        call = {
            "model": form.get("model"),
            "language": form.get("language"),
            "filename": getattr(upload, "filename", None),
            "data": upload.file.read() if upload is not None and hasattr(upload, "file") else b"",
            "authorization": request.headers.get("Authorization", ""),
        }
        self.transcriptions.append(call)
        heard = self.heard.popleft() if self.heard else Heard(self.default_transcript)
        if heard.delay:
            await asyncio.sleep(heard.delay)
        if heard.gate is not None:
            await heard.gate.wait()
        if not call["data"] or not call["model"]:
            return self._error(Reply(status=400, error_message="file and model are required"))
        if heard.status != 200:
            return self._error(Reply(status=heard.status))
        if heard.raw is not None:
            return web.Response(body=heard.raw, content_type="application/json")
        return web.json_response({"text": heard.text})

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's text-to-speech: JSON ``model``, ``voice``, ``input``, ``response_format``."""
        body = await request.json()
        self.speech.append(
            {
                **body,
                "authorization": request.headers.get("Authorization", ""),
                "host": request.headers.get("Host", ""),
            }
        )
        spoken = self.spoken.popleft() if self.spoken else Spoken()
        if spoken.delay:
            await asyncio.sleep(spoken.delay)
        if spoken.gate is not None:
            await spoken.gate.wait()
        if not body.get("input") or not body.get("model") or not body.get("voice"):
            return self._error(Reply(status=400, error_message="input, model and voice are required"))
        if spoken.status != 200:
            return self._error(Reply(status=spoken.status, error_message=spoken.error_body))
        if spoken.location is not None:
            return web.Response(status=307, headers={"Location": spoken.location})
        fmt = body.get("response_format", "mp3")
        default_type, made = ("audio/ogg", audio.ogg_opus()) if fmt == "opus" else ("audio/mpeg", audio.mp3())
        data = made if spoken.raw is None else spoken.raw
        headers = {"Content-Type": spoken.content_type or default_type}
        if spoken.trickle is None and spoken.declared is None:
            return web.Response(body=data, headers=headers)
        stream = web.StreamResponse(headers=headers)
        if spoken.declared is not None:
            stream.content_length = spoken.declared
        await stream.prepare(request)
        await stream.write(data[:256])
        while True:  # until the client gives up (the connection closes under this handler)
            await asyncio.sleep(spoken.trickle or 3600)
            await stream.write(data[:8])

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=json.loads)
        if self.record:
            self.requests.append(body)
        problem = _check_tool_pairing(body.get("messages") or ())
        if problem:
            return self._error(Reply(status=400, error_message=problem))
        reply = self._choose(body)
        if reply.first_byte_delay:
            await asyncio.sleep(reply.first_byte_delay)
        if reply.hold is not None:
            await reply.hold.wait()
        if reply.status != 200:
            return self._error(reply)
        model = body.get("model", "fake-model")
        cid = f"chatcmpl-{next(self._ids)}"
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, reply, cid, model, usage)
        if reply.chunk_delay:  # a slow model is as slow without streaming: all of it, then the answer
            await asyncio.sleep(reply.chunk_delay * reply.chunks)
        return self._complete(body, reply, cid, model)

    def _error(self, reply: Reply) -> web.Response:
        headers = {}
        if reply.retry_after is not None:
            headers["Retry-After"] = f"{reply.retry_after:g}"
        message = reply.error_message or f"fake error {reply.status}"
        err_type = _ERROR_TYPES.get(reply.status, "server_error")
        payload = {"error": {"message": message, "type": err_type, "param": None, "code": err_type}}
        return web.json_response(payload, status=reply.status, headers=headers)

    @staticmethod
    def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
        calls = []
        for i, call in enumerate(reply.tool_calls):
            args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            calls.append(
                {
                    "id": call.id or f"call_{i}_{call.name}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": args},
                }
            )
        return calls

    def _complete(self, body: dict[str, Any], reply: Reply, cid: str, model: str) -> web.Response:
        calls = self._tool_calls(reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if calls:
            message["tool_calls"] = calls
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        payload = {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        }
        if self.report_usage:
            payload["usage"] = _usage(body, reply)
        return web.json_response(payload)

    async def _stream(
        self, request: web.Request, reply: Reply, cid: str, model: str, usage: bool
    ) -> web.StreamResponse:
        created = int(time.time())
        head = (
            f'{{"id":"{cid}","object":"chat.completion.chunk","created":{created},'
            f'"model":{json.dumps(model)},'
        )

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return f'data: {head}"choices":[{json.dumps(choice)}]}}\n\n'.encode()

        frames = [chunk({"role": "assistant", "content": ""})]
        frames += [chunk({"content": piece}) for piece in _split(reply.text, reply.chunks)]
        for i, call in enumerate(self._tool_calls(reply)):
            fn = call["function"]
            first = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": ""},
            }
            frames.append(chunk({"tool_calls": [first]}))
            for piece in _split(fn["arguments"], 2):
                frames.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        frames.append(chunk({}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")))
        if usage and self.report_usage:
            u = json.dumps(_usage({}, reply))
            frames.append(f'data: {head}"choices":[],"usage":{u}}}\n\n'.encode())
        frames.append(b"data: [DONE]\n\n")

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if reply.drop_after is not None:
            await resp.write(b"".join(frames[: 1 + reply.drop_after]))
            await asyncio.sleep(0.05)  # let the client read what it got, then vanish
            if request.transport is not None:
                request.transport.abort()
            return resp
        try:
            if not reply.chunk_delay:
                await resp.write(b"".join(frames))
            else:
                # The role frame goes out with the first piece; the pauses come between pieces.
                await resp.write(frames[0] + frames[1])
                for frame in frames[2:]:
                    await asyncio.sleep(reply.chunk_delay)
                    await resp.write(frame)
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away (a cancelled turn): nothing to finish
        return resp


def _check_tool_pairing(messages: Sequence[dict[str, Any]]) -> str:
    """The rule the real API enforces (HTTP 400): every assistant ``tool_calls`` entry must be
    answered by a ``tool`` message right after it, and no ``tool`` message may answer nothing."""
    open_ids: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'."
                )
            open_ids.discard(message["tool_call_id"])
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding "
                "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                f"{sorted(open_ids)}"
            )
        if role == "assistant":
            open_ids = {call.get("id") for call in message.get("tool_calls") or ()}
    return ""


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    prompt, completion = reply.usage or (10, max(1, len(reply.text) // 4))
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}  # fmt: skip
    if reply.cached:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached}
    return usage


def _long_answer() -> str:
    """About 10,000 characters of Markdown with a fenced code block in the middle."""
    para = (
        "Chital keeps this paragraph long on purpose so that chat platforms must split the answer "
        "into several messages at sensible boundaries. "
    ) * 4
    code = "```python\n" + "".join(f"print('line {i}')\n" for i in range(40)) + "```\n"
    parts: list[str] = []
    while sum(map(len, parts)) < 4500:
        parts.append(para + "\n\n")
    parts.append(code + "\n")
    while sum(map(len, parts)) < 10_000:
        parts.append(para + "\n\n")
    return "".join(parts)[:10_000]


def main() -> None:
    """Run standalone (benchmarks keep the fake's CPU out of the measured process)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--demo-rules", action="store_true")
    parser.add_argument("--summaries", action="store_true", help="answer summary prompts with SUMMARY_TEXT")
    args = parser.parse_args()

    async def serve() -> None:
        fake = FakeOpenAI(record=False)
        if args.demo_rules:
            fake.add_demo_rules()
        if args.summaries:
            fake.add_rule(lambda t: SUMMARY_MARKER in t, Reply(text=SUMMARY_TEXT))
        await fake.start(args.port)
        print(fake.base_url, flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
