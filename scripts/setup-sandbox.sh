#!/usr/bin/env bash
# Prepare a fresh Debian machine (as root) for Chital's sandboxes: bubblewrap for the `local`
# provider, a Docker engine plus the `chital-sandbox:latest` image for the `docker` provider.
#
# Idempotent: every step checks whether its result already exists. Used by CI and by hand.
# The machine may reach Debian's package mirror but no container registry, so the base image is
# built with debootstrap from the same mirror apt uses and imported into Docker.
#
# Environment knobs:
#   CHITAL_BASE_IMAGE     (default chital-base:bookworm)
#   CHITAL_SANDBOX_IMAGE  (default chital-sandbox:latest)
#   CHITAL_DEBIAN_SUITE   (default bookworm)
#   DOCKERD_WAIT          seconds to wait for dockerd (default 60)
set -euo pipefail

BASE_IMAGE="${CHITAL_BASE_IMAGE:-chital-base:bookworm}"
SANDBOX_IMAGE="${CHITAL_SANDBOX_IMAGE:-chital-sandbox:latest}"
SUITE="${CHITAL_DEBIAN_SUITE:-bookworm}"
DOCKERD_WAIT="${DOCKERD_WAIT:-60}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERD_LOG=/var/log/chital-dockerd.log

log() { printf '[setup-sandbox] %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root"; exit 1
fi
export DEBIAN_FRONTEND=noninteractive

# --- 1. packages -----------------------------------------------------------------------------
need=()
for pkg in bubblewrap docker.io debootstrap tini iptables ca-certificates; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "installing: ${need[*]}"
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
else
    log "packages present"
fi

# --- 2. docker engine ------------------------------------------------------------------------
docker_ok() { timeout 10 docker info >/dev/null 2>&1; }
if ! docker_ok; then
    log "starting dockerd (log: $DOCKERD_LOG)"
    # setsid: dockerd must outlive this script (CI runs the tests after it).
    setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 < /dev/null &
    deadline=$((SECONDS + DOCKERD_WAIT))
    until docker_ok; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "dockerd did not answer within ${DOCKERD_WAIT}s; last log lines:"
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 1
    done
fi
log "docker engine answers"

# --- 3. base image from debootstrap ----------------------------------------------------------
# The mirror apt itself uses for the main suite (so debootstrap goes where apt is allowed to go).
debian_mirror() {
    local m
    m="$(apt-get indextargets --format '$(SITE) $(CODENAME) $(ORIGIN)' 'Created-By: Packages' 2>/dev/null \
        | awk -v s="$SUITE" '$2 == s && $3 == "Debian" && $1 !~ /security/ {print $1; exit}')"
    if [ -z "$m" ]; then
        # indextargets is empty before the first `apt-get update`; read the sources files instead.
        m="$(grep -rhoE '(URIs:|^deb)[[:space:]]+[^[:space:]]+/debian/?([[:space:]]|$)' \
            /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
            | awk '{print $2}' | grep -v security | head -n1 || true)"
    fi
    printf '%s\n' "${m:-http://deb.debian.org/debian}"
}

if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "base image $BASE_IMAGE present"
else
    mirror="$(debian_mirror)"
    rootfs="$(mktemp -d /var/tmp/chital-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    log "debootstrap $SUITE from $mirror into $rootfs"
    debootstrap --variant=minbase --include=python3,coreutils,procps "$SUITE" "$rootfs" "$mirror"
    # Trim what a sandbox never needs (apt lists and caches, docs) to keep the image small.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
    log "importing as $BASE_IMAGE"
    tar --numeric-owner -C "$rootfs" -c . | docker import - "$BASE_IMAGE"
    rm -rf "$rootfs"
    trap - EXIT
fi

# --- 4. sandbox image ------------------------------------------------------------------------
# Always (re)build: the layer cache makes an unchanged Dockerfile a no-op. The legacy builder
# needs no buildx plugin; --network none because the build fetches nothing.
log "building $SANDBOX_IMAGE"
DOCKER_BUILDKIT=0 docker build -q --network none \
    --build-arg "BASE=$BASE_IMAGE" \
    -t "$SANDBOX_IMAGE" -f "$REPO_ROOT/sandbox-image/Dockerfile" "$REPO_ROOT/sandbox-image" >/dev/null
log "ready: bwrap $(command -v bwrap), image $SANDBOX_IMAGE"
