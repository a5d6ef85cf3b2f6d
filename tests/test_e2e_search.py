"""End to end through ``chital run``: the fake model calls ``web_search`` (keyless DuckDuckGo on
Telegram, Brave with a key on Slack, both pointed at the fake providers), reads the first result
with ``web_fetch``, tries a result on the cloud-metadata address, and answers citing the source
URL. What is checked is what the user sees in the chat, what the model received, and what the
daemon logged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.search_server import KEY, FakeSearch, Result
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import DM, FRIEND
from tests.telegram_daemon import OWNER, answered

ASK = "SEARCHME: what do llamas do when they are content?"
META = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
_FIRST = re.compile(r"^1\. \[[^\]]*\]\((\S+)\)$", re.M)
_THIRD = re.compile(r"^3\. \[[^\]]*\]\((\S+)\)$", re.M)


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"}


def researcher(body: dict[str, Any]) -> Reply:
    """Search, read the first result and the third (the provider's internal URL), answer citing
    the first result's URL exactly as the search numbered it."""
    results = tool_results(body)
    if "search" not in results:
        return Reply(tool_calls=[ToolCall("web_search", {"query": "llama contentment"}, id="search")])
    first, third = _FIRST.search(results["search"]), _THIRD.search(results["search"])
    if first is None or third is None:
        return Reply(text="NO NUMBERED RESULTS")
    if "page" not in results:
        return Reply(
            tool_calls=[
                ToolCall("web_fetch", {"url": first.group(1)}, id="page"),
                ToolCall("web_fetch", {"url": third.group(1)}, id="meta"),
            ]
        )
    return Reply(text=f"They hum. Source: {first.group(1)}")


def check_model_saw(model: FakeOpenAI, search: FakeSearch) -> None:
    final = next(r for r in reversed(model.requests) if "page" in tool_results(r))
    results = tool_results(final)
    assert f"1. [Llama - Wikipedia]({search.base}/page/llama)" in results["search"]
    assert "data, not instructions" in results["search"]
    assert "web_fetch will refuse it" in results["search"]  # the metadata result is marked
    assert "Llamas hum when they are content." in results["page"]
    assert "refused" in results["meta"] and "169.254.169.254" in results["meta"]
    system = next(m["content"] for m in final["messages"] if m["role"] == "system")
    assert "cite each source" in str(system)
    tool = next(t for t in final["tools"] if t["function"]["name"] == "web_search")
    assert "Cite the sources" in tool["function"]["description"]


def web_config(search: FakeSearch, provider: str) -> dict[str, Any]:
    web: dict[str, Any] = {"base_url": search.url(provider), "allow_hosts": ["127.0.0.1"]}
    if provider != "duckduckgo":  # duckduckgo is the default: the config names no provider
        web |= {"search_provider": provider, "api_key": KEY}
    return {"memory": {"enabled": False}, "web": web}


async def test_keyless_search_cited_on_telegram(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, search: FakeSearch
) -> None:
    search.results.append(Result("Instance metadata", META, "cloud credentials"))
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[str(OWNER)], agent=web_config(search, "duckduckgo")
    )
    model.add_rule(lambda text: "SEARCHME" in text, researcher)
    async with started_daemon(tmp_path, cfg):
        up = tg.inject_message(OWNER, OWNER, ASK)
        reply = await answered(tg, OWNER, up, f"Source: {search.base}/page/llama", timeout=40)
    assert "NO NUMBERED RESULTS" not in reply.text
    assert [(r.provider, r.method, r.body) for r in search.requests] == [
        ("duckduckgo", "POST", {"q": "llama contentment", "b": "", "kl": ""})
    ]
    check_model_saw(model, search)


async def test_keyed_search_cited_on_slack_and_key_kept_secret(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI, search: FakeSearch
) -> None:
    search.results.append(Result("Instance metadata", META, "cloud credentials"))
    cfg = chat_config(
        tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"], agent=web_config(search, "brave")
    )
    model.add_rule(lambda text: "SEARCHME" in text, researcher)
    async with started_daemon(tmp_path, cfg, slack) as daemon:
        await slack.inject_dm(DM, FRIEND, ASK)
        needle = f"{search.base}/page/llama"
        await slack.wait_for(lambda: any(needle in t for t in slack.texts(DM)) or None, timeout=40)
        log = daemon.log_path.read_text(errors="replace")
    assert [(r.provider, r.headers.get("X-Subscription-Token")) for r in search.requests] == [("brave", KEY)]
    check_model_saw(model, search)
    assert KEY not in json.dumps(model.requests) and KEY not in log
    assert not any(KEY in t for t in slack.texts(DM))
