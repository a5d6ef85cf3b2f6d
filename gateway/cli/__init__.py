"""The operator's command line: ``chital`` and its sub-commands (start, check, init, status, send, chat,
pairing, migrate). The top layer: it may import every other part of the gateway, nothing imports it."""
