"""Chat commands: one registry of rows (name, help, who may run it, whether its reply is recorded,
its handler) from which the parser and /help are derived, and the handlers, which get a narrow
context (registry.CommandContext), not the Gateway."""
