"""Slack channel adapter (slack-bolt over Socket Mode, slack_sdk's Web API)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import SlackSettings

if TYPE_CHECKING:
    from .channel import SlackChannel

__all__ = ["SlackChannel", "SlackSettings"]
__getattr__ = lazy_exports(__name__, {"SlackChannel": ".channel"})
