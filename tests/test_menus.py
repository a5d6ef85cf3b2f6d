"""The menu every platform publishes is derived from the one command registry (gateway/daemon/menus.py):
its rows in ``/help`` order with their admin marks, then the callable skills; entries a platform
could not take are left out; what a skill says about itself is shown as one clean line, and the
egress wrapper masks the daemon's secrets in it before any adapter sees it."""

from __future__ import annotations

from pathlib import Path

from channels.base import Channel, Menu, ReplyTarget
from channels.menus import NAME, MenuCommand, fit
from gateway.commands.builtin import REGISTRY
from gateway.commands.registry import Who
from gateway.config.schema import parse_config
from gateway.daemon.menus import commands, registry_commands
from tests.skill_archives import skill_md


def _config(tmp_path: Path) -> object:
    custom = tmp_path / "custom"
    for name, about in (
        ("house-style", "Write in the house style.\u202e\u200b and   more"),
        ("help", "a skill named like a built-in"),
        ("x" * 40, "too long a name for any menu"),
    ):
        (custom / name).mkdir(parents=True)
        (custom / name / "SKILL.md").write_bytes(skill_md(name, about))
    return parse_config({"agent": {"skills": {"custom_dir": str(custom), "reload_seconds": 0}}})


def test_menu_is_the_registry_then_the_skills(tmp_path: Path) -> None:
    rows = registry_commands()
    assert [c.name for c in rows] == [r.name for r in REGISTRY.rows], "every row, in /help order"
    assert {c.name for c in rows if c.admin} == set(REGISTRY.names(Who.ADMIN))
    entries = commands(_config(tmp_path))  # type: ignore[arg-type]
    names = [c.name for c in entries]
    assert names[: len(rows)] == [c.name for c in rows]
    assert "house_style" in names, "a skill is offered as /house_style"
    assert names.count("help") == 1, "a skill named like a built-in is not a second entry"
    assert all(NAME.fullmatch(n) for n in names) and len(entries) <= 100
    style = next(c for c in entries if c.name == "house_style")
    assert "\u202e" not in style.description and "\u200b" not in style.description
    assert "  " not in style.description and style.description.startswith("skill: Write in the house style.")


def test_fit_keeps_a_line_within_the_limit() -> None:
    assert fit("a  b\nc", 100) == "a b c"
    assert fit("x" * 300, 100) == "x" * 99 + "…"
    assert fit("   ", 10) == "-", "platforms refuse an empty description"


async def test_the_egress_wrapper_masks_menu_descriptions() -> None:
    seen: list[Menu] = []

    class Probe(Channel):
        name = "probe"

        async def run(self, sink: object) -> None:  # type: ignore[override]
            return None

        def render(self, markdown: str) -> list[object]:  # type: ignore[override]
            return []

        async def send(self, target: ReplyTarget, part: object, *, idempotency_key: str) -> str:  # type: ignore[override]
            return ""

        async def edit(self, target: ReplyTarget, message_id: str, part: object) -> None:  # type: ignore[override]
            return None

        async def register_commands(self, menu: Menu) -> str:
            seen.append(menu)
            return "ok"

    probe = Probe()
    probe.egress = type("Mask", (), {"__call__": lambda self, t: t.replace("sk-SECRET", "***")})()  # type: ignore[assignment]
    menu = Menu((MenuCommand("leak", "uses sk-SECRET", "[sk-SECRET]"),), ("42",))
    assert await probe.register_commands(menu) == "ok"
    assert seen[0].commands[0].description == "uses ***" and seen[0].commands[0].usage == "[***]"
    assert seen[0].admin_chats == ("42",)
