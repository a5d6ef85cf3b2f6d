"""Running a turn: per-conversation order and the global cap, the runner that drives the agent,
approvals, /stop, budgets and usage and the queued sign."""
