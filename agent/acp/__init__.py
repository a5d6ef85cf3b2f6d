"""Coding agents over the Agent Client Protocol (docs/coding-agents.md): the lead hands a task to
an external agent (Claude Code, Codex, any ACP agent) run inside the conversation's sandbox."""
