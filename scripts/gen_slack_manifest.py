"""Write the ``slash_commands`` block of slack-app-manifest.yaml from the command registry.

    python scripts/gen_slack_manifest.py            # rewrite the block in slack-app-manifest.yaml
    python scripts/gen_slack_manifest.py --check    # exit 1 if the checked-in block is stale

Slack has no API that sets an app's slash commands: the operator pastes the manifest. So the
manifest's list is generated from the same rows the parser and ``/help`` use
(gateway/daemon/menus.py ``registry_commands``, channels/slack/commands.py ``manifest_entries``),
between two marker comments, and tests/test_menus_slack.py fails when it is stale: a command added
to the registry cannot be missing from Slack.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from channels.slack.commands import manifest_entries  # noqa: E402
from gateway.daemon.menus import registry_commands  # noqa: E402

MANIFEST = ROOT / "slack-app-manifest.yaml"
BEGIN = "  # BEGIN slash_commands: generated from the command registry by scripts/gen_slack_manifest.py\n"
END = "  # END slash_commands\n"


def block() -> str:
    """The generated block, markers included, indented under ``features:``."""
    body = yaml.safe_dump(
        {"slash_commands": manifest_entries(registry_commands())},
        sort_keys=False, allow_unicode=True, width=10_000,
    )  # fmt: skip
    return BEGIN + "".join(f"  {line}\n" for line in body.splitlines()) + END


def render(text: str) -> str:
    """``text`` (the manifest) with its block replaced by the generated one."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block() + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the block is out of date")
    args = parser.parse_args(argv)
    current = MANIFEST.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(f"{MANIFEST} is out of date: run python scripts/gen_slack_manifest.py", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        MANIFEST.write_text(wanted, encoding="utf-8")
        print(f"wrote {MANIFEST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
