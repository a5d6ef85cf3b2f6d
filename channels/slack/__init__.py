"""Slack channel adapter (slack-bolt over Socket Mode, slack_sdk's Web API)."""

from .channel import SlackChannel

__all__ = ["SlackChannel"]
