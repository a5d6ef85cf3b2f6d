# The Chital daemon.
#
#   docker build -t chital .                                    # python:3.12-slim, deps from PyPI
#   docker build -t chital --build-arg BASE=debian:bookworm .   # any Debian-based image with apt
#
# Dependencies: requirements.lock, the exact versions the test suite passed on (runtime plus the
# postgres extra, which compose.scale.yaml's replicas need). Offline (no PyPI from the build):
# docs/deploy.md's recipe downloads the lock's wheels for the image's Python into wheelhouse/; a
# wheelhouse/ in the context is installed with --no-index. Running it, the sandbox flags and
# compose: docs/deploy.md.
#
# Two stages so that neither the wheels, pip's build leftovers nor apt's lists reach the image, and
# so that a code change rebuilds only the last small layers (the dependency layer is keyed on
# requirements.lock and wheelhouse/ alone).
ARG BASE=python:3.12-slim

# --- build: a virtualenv with the dependencies -------------------------------------------------
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# A venv, not the system site-packages: Debian's python3 is "externally managed" (PEP 668) and
# refuses pip installs; python:*-slim ships venv, Debian needs python3-venv (and python3 itself
# on bases without it).
RUN set -eu; \
    pkgs=""; \
    command -v python3 >/dev/null || pkgs="python3"; \
    python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs="$pkgs python3-venv"; \
    if [ -n "$pkgs" ]; then \
        apt-get update -q; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/chital

# requirements.lock always matches, so the optional wheelhouse/ may be absent.
COPY requirements.lock wheelhous[e] /tmp/wheels/
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN set -eu; \
    cd /tmp/wheels; \
    if ls ./*.whl >/dev/null 2>&1; then \
        echo "chital: installing from wheelhouse/ (offline)"; set -- --no-index --find-links /tmp/wheels; \
    else \
        echo "chital: installing from $PIP_INDEX_URL"; set --; \
    fi; \
    /opt/chital/bin/pip install -q "$@" -r requirements.lock 'setuptools>=69'; \
    rm -rf /tmp/wheels

# --- the image -------------------------------------------------------------------------------
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/chital/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
# bubblewrap: the `local` sandbox. tini: PID 1 that forwards SIGTERM (graceful shutdown) and reaps
# the orphans of killed commands. util-linux: prlimit (the sandbox's rlimits). ca-certificates:
# TLS to the chat platforms and the model.
# uid 10001: no host user has it by accident, so a container escape lands on a nobody.
# /app/data → /data: a config mounted at /app/config.yaml without storage.path (default ./data
# beside the file) still writes to the volume, not into the read-only image.
RUN set -eu; \
    pkgs="bubblewrap tini util-linux ca-certificates"; \
    command -v python3 >/dev/null || pkgs="$pkgs python3"; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs; \
    apt-get clean; rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    groupadd --gid 10001 chital; \
    useradd --uid 10001 --gid 10001 --no-create-home --home-dir /data --shell /usr/sbin/nologin chital; \
    mkdir -p /data /app; chown 10001:10001 /data; chmod 0700 /data; \
    ln -s /data /app/data

COPY --from=build /opt/chital /opt/chital
COPY pyproject.toml README.md /tmp/src/
COPY gateway /tmp/src/gateway
COPY channels /tmp/src/channels
COPY agent /tmp/src/agent
COPY compat /tmp/src/compat
# --no-build-isolation: setuptools is already in the venv, so this step needs no index.
RUN /opt/chital/bin/pip install -q --no-deps --no-build-isolation /tmp/src && rm -rf /tmp/src

WORKDIR /app
COPY skills ./skills
COPY config.yaml ./config.yaml

# CHITAL_HTTP_HOST: health and metrics must answer on the container's interface for
# `docker run -p 8787:8787` (the daemon's own default is 127.0.0.1).
ENV CHITAL_CONFIG=/app/config.yaml CHITAL_DATA=/data CHITAL_HTTP_HOST=0.0.0.0 HOME=/data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["chital", "run"]
