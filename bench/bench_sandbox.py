"""Exec latency of the sandbox providers: p50/p99 of a trivial command, warm and cold.

    python bench/bench_sandbox.py [--warm 50] [--cold 10]
        [--provider local|docker|docker-shared|kubernetes-fake|all]

warm: ``true`` in a sandbox that already exists (Docker: container running).
read_file: a one-line file read with the file tool (docker-shared: through the engine).
cold: a new thread's first command, acquire included (Docker: container creation and start).
kubernetes-fake: the kubernetes provider against our fake API server (tests/fakes/), in this
process, as root with bwrap: the client's REST and websocket cost plus a bwrap per exec, never a
cluster's (no kubelet, no container runtime, no network hop).
A provider that cannot run here (no bwrap, no engine) is reported and skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.sandbox import SandboxProvider, SandboxUnavailable
from agent.sandbox.docker_shared import SharedDockerProvider
from agent.sandbox.local import LocalProvider


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(name: str, samples: list[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"{name:<14} n={len(ms):<4} p50={pct(ms, 0.5):8.1f} ms  p99={pct(ms, 0.99):8.1f} ms  "
        f"mean={statistics.fmean(ms):8.1f} ms"
    )


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    t = time.perf_counter()
    await fn()
    return time.perf_counter() - t


async def bench(name: str, provider: SandboxProvider, warm: int, cold: int) -> None:
    await provider.reconcile()
    try:
        sb = await provider.acquire("bench-warm")
        res = await sb.exec("true")
        if res.exit_code != 0:
            print(f"{name}: cannot run commands: {res.output.strip()[:200]}")
            return
        warm_s = [await timed(lambda: sb.exec("true")) for _ in range(warm)]
        report(f"{name} warm", warm_s)
        await sb.write_file("bench.txt", "one line\n")
        read_s = [await timed(lambda: sb.read_file("bench.txt")) for _ in range(warm)]
        report(f"{name} read_file", read_s)
        cold_s = []
        for i in range(cold):

            async def first(i: int = i) -> None:
                s = await provider.acquire(f"bench-cold-{i}")
                await s.exec("true")

            cold_s.append(await timed(first))
        report(f"{name} cold", cold_s)
    except SandboxUnavailable as e:
        print(f"{name}: unavailable: {e}")
    finally:
        if isinstance(provider, SharedDockerProvider) or name.startswith("kubernetes"):  # they outlive it
            for tid in ["bench-warm", *(f"bench-cold-{i}" for i in range(cold))]:
                await provider.discard(tid)
        await provider.close()


async def bench_fake_kubernetes(root: Path, warm: int, cold: int) -> None:
    from agent.sandbox.config import KubernetesSettings
    from agent.sandbox.kubernetes_provider import KubernetesProvider
    from tests.fakes.kubernetes_server import FakeKubernetes

    async with FakeKubernetes(root / "k8s", namespace="chital", start_delay=0.1) as fake:
        config = fake.write_kubeconfig(root / "kubeconfig")
        settings = KubernetesSettings(kubeconfig=config, namespace="chital")
        await bench("kubernetes-fake", KubernetesProvider(root / "kube", settings), warm, cold)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=50)
    ap.add_argument("--cold", type=int, default=10)
    choices = ["local", "docker", "docker-shared", "kubernetes-fake", "all"]
    ap.add_argument("--provider", choices=choices, default="all")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chital-bench-"))
    os.chmod(root, 0o711)
    try:
        if args.provider in ("local", "all"):
            if shutil.which("bwrap"):
                await bench("local/bwrap", LocalProvider(root / "local"), args.warm, args.cold)
            else:
                print("local/bwrap: bwrap not installed, skipped")
        if args.provider in ("docker", "all"):
            try:
                from agent.sandbox.docker_provider import DockerProvider

                provider = DockerProvider(root / "docker")
                await provider.ping()
            except SandboxUnavailable as e:
                print(f"docker: unavailable: {e}")
            else:
                await bench("docker", provider, args.warm, args.cold)
        if args.provider in ("docker-shared", "all"):
            shared = SharedDockerProvider(root / "shared")
            try:
                await shared.ping()
            except SandboxUnavailable as e:
                print(f"docker-shared: unavailable: {e}")
            else:
                await bench("docker-shared", shared, args.warm, args.cold)
        if args.provider in ("kubernetes-fake", "all"):
            if shutil.which("bwrap") and os.geteuid() == 0:
                await bench_fake_kubernetes(root, args.warm, args.cold)
            else:
                print("kubernetes-fake: needs bwrap and root (the fake's pods), skipped")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
