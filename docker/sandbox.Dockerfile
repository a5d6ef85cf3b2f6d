# Image for Chital's `docker` sandbox provider: one long-lived container per conversation thread.
# BASE defaults to the public slim Python image; scripts/setup-sandbox.sh builds it FROM a local
# debootstrap import (chital-base:bookworm) because the build machine reaches no registry. So this
# file must not need the network: no apt-get, only what the base already ships (python3, coreutils,
# procps for ps/kill, bash).
ARG BASE=python:3.12-slim
FROM ${BASE}

# Non-root user 1000: the provider runs every command as 1000:1000 and chowns the host dirs to it.
RUN set -eu; \
    if ! getent passwd 1000 >/dev/null; then \
        (getent group 1000 >/dev/null || groupadd -g 1000 sandbox); \
        useradd -u 1000 -g 1000 -M -d /mnt/user-data/workspace -s /bin/bash sandbox; \
    fi; \
    mkdir -p /mnt/user-data/workspace /mnt/user-data/uploads /mnt/user-data/outputs /mnt/skills; \
    chown 1000:1000 /mnt/user-data /mnt/user-data/workspace /mnt/user-data/uploads /mnt/user-data/outputs; \
    command -v python3 >/dev/null; command -v timeout >/dev/null; command -v ps >/dev/null; \
    (command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python)

ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/mnt/user-data/workspace \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /mnt/user-data/workspace
USER 1000:1000
# PID 1 only idles; commands arrive through `docker exec`. The provider starts it with init=True so
# docker-init reaps orphans of killed commands.
CMD ["sleep", "infinity"]
