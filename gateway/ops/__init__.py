"""What the operator sees of a running daemon and what every part reports into: the HTTP probes and
metrics, logs, channel supervision and systemd notification. Low in the layering: imports only
gateway.config."""
