#!/usr/bin/env bash
# Refresh the lock files from pyproject.toml: requirements.lock (runtime + the postgres extra: what
# scripts/setup.sh, the Dockerfile and the offline wheelhouse install) and requirements-test.lock
# (the same versions plus the test tools: what scripts/test.sh and CI install).
#
#   bash scripts/lock.sh            # keep the locked versions where pyproject.toml still allows them
#   bash scripts/lock.sh --upgrade  # take the newest versions pyproject.toml allows
#
# Then run the whole suite (bash scripts/test.sh) before committing the new locks: they claim the
# tests passed on them. Universal (any OS, Python >= 3.11) with the fewest forks, so one file serves
# the host, the image's Python and Debian 12's 3.11.2 alike (uv: `pip install uv`).
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--universal --fork-strategy fewest --python-version 3.11 --annotation-style line
        --custom-compile-command "bash scripts/lock.sh" "$@")
uv pip compile pyproject.toml --extra postgres "${common[@]}" -o requirements.lock
uv pip compile pyproject.toml --extra postgres --extra test -c requirements.lock "${common[@]}" \
    -o requirements-test.lock
