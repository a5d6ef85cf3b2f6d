"""What the Docker sandbox tests share: the image they run and whether an engine answers here."""

from __future__ import annotations

import os

IMAGE = os.environ.get("CHITAL_SANDBOX_IMAGE", "chital-sandbox:latest")


def _engine() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as e:
        return f"no Docker engine answers ({type(e).__name__}); run scripts/setup-sandbox.sh"
    return None


DOCKER_MISSING = _engine()
"""Why the Docker tests skip here, or None when an engine answers."""
