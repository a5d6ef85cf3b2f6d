"""Voice notes and audio files to text, through an OpenAI-compatible ``/audio/transcriptions``.

The ``openai`` SDK (already here under langchain-openai) speaks the endpoint, multipart upload
included; OpenAI and self-hosted Whisper servers (faster-whisper-server, LocalAI, vLLM) answer it
alike. A transcript is recorded under the message's journal key before the turn uses it, so a turn
resumed after a crash reads it back instead of paying for (and maybe hearing differently) the
same recording twice. Failures become one plain sentence for the user, never the service's own
error text (which may quote the request) and never the key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.config.sections import TranscriptionConfig
from gateway.store.journal import Store

log = logging.getLogger(__name__)

OPENAI_API = "https://api.openai.com/v1"
"""Where recordings go when ``transcription.base_url`` is unset (and an ``api_key`` is)."""
SHOWN_CHARS = 500
"""Characters of a transcript quoted back in the "🎙 heard" line (``show_transcript``)."""

# Whisper goes by the upload's file name to tell the container; these are the names it knows.
_UPLOAD_SUFFIX = {".opus": ".ogg", ".oga": ".ogg", ".weba": ".webm", ".m4a": ".m4a"}


class TranscriptionFailed(Exception):
    """The recording could not be transcribed; the message is fit for the chat."""


@dataclass(frozen=True, slots=True)
class Heard:
    """What one recording said, or why it could not be heard."""

    name: str
    """The file name the agent sees in its uploads."""
    text: str = ""
    problem: str = ""


def upload_name(name: str) -> str:
    """``name`` with a suffix the transcription service recognises (Lark's ``.opus`` is Ogg)."""
    stem, dot, suffix = name.rpartition(".")
    if not dot:
        return name + ".ogg"
    return stem + _UPLOAD_SUFFIX.get("." + suffix.lower(), "." + suffix)


MAX_ANSWER_BYTES = 1024 * 1024
"""Bytes of the service's answer read at most: a transcript of the longest recording the service
takes is far shorter; more is a misconfigured or hostile endpoint, never held in memory whole."""


async def transcribe(cfg: TranscriptionConfig, name: str, data: bytes, mime: str | None) -> str:
    """The text of one recording. Raises :class:`TranscriptionFailed` with a chat-safe reason that
    says what went wrong: an answer that is not JSON, an HTTP error and its status, a timeout, an
    empty transcript, an answer too large to be one."""
    if len(data) > cfg.max_bytes:
        raise TranscriptionFailed(
            f"it is {len(data) / 1e6:.1f} MB, over the {cfg.max_bytes / 1e6:.0f} MB the transcriber takes"
        )
    import openai  # on the first recording: the daemon's agent imports it anyway, other commands need not

    key = cfg.api_key.get_secret_value() if cfg.api_key else "none"  # the SDK insists on some key
    # The base URL is always passed: the SDK would otherwise take $OPENAI_BASE_URL, which may name
    # the chat model's server rather than the transcriber.
    client = openai.AsyncOpenAI(
        api_key=key, base_url=cfg.base_url or OPENAI_API, timeout=cfg.timeout, max_retries=cfg.retries
    )
    file = (upload_name(posixpath.basename(name)), data, mime or "application/octet-stream")
    try:
        # One deadline over the calls, their retries and reading the answer: a service that
        # trickles bytes forever cannot hold the recording's turn longer than this.
        async with asyncio.timeout(cfg.timeout * (cfg.retries + 1) + 5):
            # The streamed form hands over the raw body: read capped, parsed here, so an answer
            # that is not JSON (or is huge) becomes a sentence instead of an exception in the SDK.
            async with client.audio.transcriptions.with_streaming_response.create(
                model=cfg.model, file=file, language=cfg.language or openai.omit
            ) as response:
                body = await _read_capped(response.iter_bytes(), MAX_ANSWER_BYTES)
    except (TimeoutError, openai.APITimeoutError):
        raise TranscriptionFailed(
            f"the transcription service did not answer in time (within {cfg.timeout:g} s)"
        ) from None
    except openai.APIStatusError as exc:
        log.warning("transcription of %s failed: HTTP %s", name, exc.status_code)
        raise TranscriptionFailed(_status_reason(exc.status_code)) from None
    except openai.APIConnectionError:
        raise TranscriptionFailed("I could not reach the transcription service") from None
    except openai.OpenAIError as exc:
        log.warning("transcription of %s failed: %s", name, type(exc).__name__)
        raise TranscriptionFailed("the transcription service gave an answer I could not read") from None
    finally:
        await client.close()
    text = _transcript(body, name)
    if not text:
        raise TranscriptionFailed(
            "the transcript came back empty (I heard no words; if you spoke, please record it again)"
        )
    return text


async def _read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) > limit:
            raise TranscriptionFailed(
                f"the transcription service sent back more than {limit // 1024} KB, which is not a "
                "transcript (the admin should check transcription.base_url)"
            )
    return bytes(out)


def _transcript(body: bytes, name: str) -> str:
    """The ``text`` of the service's JSON answer, or a reason the user can pass on."""
    try:
        answer = json.loads(body)
    except ValueError:
        log.warning("transcription of %s: the answer is not JSON (%d bytes)", name, len(body))
        raise TranscriptionFailed(
            "the transcription service sent back something that is not valid JSON, so there is no "
            "transcript (the admin should check transcription.base_url and model)"
        ) from None
    text = answer.get("text") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        log.warning("transcription of %s: the JSON answer has no text field", name)
        raise TranscriptionFailed(
            'the transcription service answered without a transcript (no "text" in its JSON; the '
            "admin should check that transcription.base_url is an OpenAI-compatible transcriber)"
        )
    return text.strip()


def _status_reason(status: int) -> str:
    if status == 413:
        return "the recording is too large for the transcription service"
    if status in (401, 403):
        return "the transcription service refused my key (ask the admin)"
    if status == 429:
        return "the transcription service is busy; please try again in a minute"
    if status >= 500:
        return f"the transcription service failed (HTTP {status})"
    return f"the transcription service could not use this recording (HTTP {status})"


def _record_key(message_key: str, index: int) -> str:
    return f"{message_key}#heard:{index}"


async def heard(
    store: Store, cfg: TranscriptionConfig, message_key: str, index: int, name: str, data: bytes,
    mime: str | None, max_chars: int,
) -> Heard:  # fmt: skip
    """The transcript of the ``index``-th recording of message ``message_key``: the one the store
    kept from an earlier attempt, else a fresh one (then kept, first writer wins). A transcript
    longer than ``max_chars`` (the inbound text limit) is cut. Failures are not kept: a resumed
    turn tries again."""
    key = _record_key(message_key, index)
    kept = await store.command_result(key)
    if kept is not None:
        return Heard(name, text=json.loads(kept)["text"])
    try:
        text = await transcribe(cfg, name, data, mime)
    except TranscriptionFailed as exc:
        return Heard(name, problem=str(exc))
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    value, _ = await store.command_result_put(key, json.dumps({"text": text}, ensure_ascii=False))
    return Heard(name, text=json.loads(value)["text"])
