"""What the operator sees of a running daemon: the HTTP probes and metrics, logs, the status socket,
channel supervision, systemd notification and the start-up summary."""
