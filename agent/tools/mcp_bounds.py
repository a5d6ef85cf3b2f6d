"""What an MCP server may declare: its tools screened when they are listed, before any reaches a model.

A server's ``tools/list`` answer is untrusted and only bounded in bytes (``max_response_bytes``).
Each tool's name, description and input schema end up in the model's request whenever the tool is
bound (every call with ``tool_search`` off; after a search finds it, with it on), so a hostile or
careless server could otherwise put megabytes of text in every prompt. Chosen bounds:

- **name**: what the model APIs accept (``[A-Za-z0-9_-]{1,64}``); another is left out;
- **description**: invisible characters removed, cut to :data:`DESCRIPTION_CHARS` (cutting prose
  keeps it usable);
- **input schema**: at most ``max_schema_chars`` as JSON, else the tool is **left out** (a cut
  schema is not valid JSON Schema, and a schema that large is not meant for a model); the
  ``description`` and ``title`` texts inside it are cleaned and cut like the tool's description;
- **count**: at most ``max_tools_per_server`` tools per server, the rest left out;
- **secrets**: the daemon's secret values are masked in the description and in every string of
  the schema (the catalog's ``redact``), since the tools array goes to the model provider.

What was left out or cut is said once per listing in the log (server name, counts, the first
names) and kept as notes that ``/mcp`` shows next to the server, in Chital's words.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from agent.settings import McpSettings
from agent.untrusted import code_span, visible

log = logging.getLogger(__name__)

DESCRIPTION_CHARS = 2000
"""Characters of a tool's description (server-provided) that reach the model."""
SCHEMA_TEXT_CHARS = 500
"""Characters of one ``description`` or ``title`` inside an input schema."""
NAMES_NOTED = 5
"""Tool names a note lists (the rest are counted)."""
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What the model APIs accept as a function name."""


def bounded_description(text: str) -> str:
    description = visible(text or "", lines=True)
    return description[:DESCRIPTION_CHARS] + " […]" if len(description) > DESCRIPTION_CHARS else description


def schema_size(schema: Any) -> int:
    """Characters of the tool's input schema as the model request carries it (JSON)."""
    if schema is None:
        return 0
    if not isinstance(schema, dict):  # a pydantic model class (not from the MCP adapter)
        schema = getattr(schema, "model_json_schema", dict)()
    try:
        return len(json.dumps(schema, ensure_ascii=False, default=str))
    except (TypeError, ValueError, RecursionError):
        return 10**9  # not serialisable: treated as too large


def _same(text: str) -> str:
    return text


def cleaned_schema(schema: Any, redact: Callable[[str], str] = _same, depth: int = 0) -> Any:
    """``schema`` with the prose inside it (``description``, ``title``) visible and bounded, and
    the daemon's secrets masked in every string value (``redact``: a careless server may quote
    its token in an example or a default); the structure and the keys as they were. A copy: the
    adapter's tool is not changed."""
    if depth > 64:
        return schema
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in ("description", "title") and isinstance(value, str):
                text = visible(value, lines=True)
                text = text[:SCHEMA_TEXT_CHARS] + " […]" if len(text) > SCHEMA_TEXT_CHARS else text
                out[key] = redact(text)
            else:
                out[key] = cleaned_schema(value, redact, depth + 1)
        return out
    if isinstance(schema, list):
        return [cleaned_schema(v, redact, depth + 1) for v in schema]
    return redact(schema) if isinstance(schema, str) else schema


def _names(names: Sequence[str]) -> str:
    """Names as code spans: a note is shown as Markdown in ``/mcp`` (``extra_1, extra_2`` would
    turn italic); they passed :data:`TOOL_NAME`, so no backtick is inside."""
    shown = ", ".join(code_span(n) for n in names[:NAMES_NOTED])
    return shown + (f" and {len(names) - NAMES_NOTED} more" if len(names) > NAMES_NOTED else "")


def screen(server: str, tools: Sequence[BaseTool], settings: McpSettings) -> tuple[list[BaseTool], list[str]]:
    """The tools of ``server`` that may reach a model, and notes on what was left out or cut."""
    kept: list[BaseTool] = []
    bad_name = 0
    too_big: list[str] = []
    cut: list[str] = []
    for tool in tools:
        if not TOOL_NAME.fullmatch(tool.name):
            bad_name += 1
            continue
        if schema_size(tool.args_schema) > settings.max_schema_chars:
            too_big.append(tool.name)
            continue
        if len(visible(tool.description or "", lines=True)) > DESCRIPTION_CHARS:
            cut.append(tool.name)
        kept.append(tool)
    over = [t.name for t in kept[settings.max_tools_per_server :]]
    kept = kept[: settings.max_tools_per_server]
    notes: list[str] = []
    if bad_name:
        notes.append(f"{bad_name} tool(s) left out: a name the model APIs refuse")
    if too_big:
        notes.append(
            f"{len(too_big)} tool(s) left out: input schema over {settings.max_schema_chars:,} characters "
            f"(`agent.mcp.max_schema_chars`): {_names(too_big)}"
        )
    if over:
        notes.append(
            f"{len(over)} tool(s) left out: more than {settings.max_tools_per_server:,} tools "
            f"(`agent.mcp.max_tools_per_server`): {_names(over)}"
        )
    if cut:
        notes.append(f"{len(cut)} tool description(s) cut to {DESCRIPTION_CHARS:,} characters: {_names(cut)}")
    for note in notes:
        log.warning("MCP server %r: %s", server, note)
    return kept, notes
