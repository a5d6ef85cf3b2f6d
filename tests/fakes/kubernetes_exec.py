"""``pods/{name}/exec`` for the fake Kubernetes API server: the websocket channel protocol and the
bubblewrap sandbox each exec runs in.

Protocol (k8s.io/apimachinery remotecommand, as ``kubernetes.stream.stream`` speaks it): the
client offers ``v5.channel.k8s.io`` and ``v4.channel.k8s.io``; every binary frame starts with its
channel byte (0 stdin, 1 stdout, 2 stderr, 3 error/status JSON, 4 resize); v5 adds ``[255, ch]``
to close a channel (the client closes stdin that way, so ``cat`` sees EOF). When the command ends
the server writes one channel-3 ``Status`` (``Success``, or ``Failure``/``NonZeroExitCode`` with the
exit code in ``details.causes[0].message``) and closes the socket.

Sandbox: each exec is a fresh ``bwrap`` built from the pod spec, started by root (the fake runs as
root) so it can bind directories the pod's user could not traverse, then ``setpriv`` drops to the
pod's ``runAsUser``/``runAsGroup`` with no capabilities and ``no_new_privs`` before the command
runs. The root is a tmpfs holding the host's /usr, /bin, /lib* read-only and a generated minimal
/etc (like a distroless image with python3), the pod's volumes at their mount paths, a fresh /proc
and /dev, and private pid/ipc/uts namespaces; the network namespace is private (loopback only) when
a deny-all-egress NetworkPolicy selects the pod, else the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from tests.fakes.kubernetes_objects import status_body

if TYPE_CHECKING:
    from tests.fakes.kubernetes_server import FakeKubernetes, _Pod

V4, V5 = "v4.channel.k8s.io", "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 64 * 1024
BWRAP = shutil.which("bwrap")
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
_SYS_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ExecRefused(Exception):
    """The exec request is refused before the upgrade (HTTP status + Status body)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _security(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's effective securityContext: container fields override the pod's."""
    merged = dict(pod["spec"].get("securityContext") or {})
    merged.update(container.get("securityContext") or {})
    return merged


def run_as(pod: dict[str, Any], container: dict[str, Any]) -> tuple[int, int]:
    """(uid, gid) the container runs as; the fake's "image" has no USER, so root by default."""
    sc = _security(pod, container)
    return int(sc.get("runAsUser", 0)), int(sc.get("runAsGroup", 0))


def _etc_dir(fake: FakeKubernetes, pod: _Pod, uid: int, gid: int) -> Path:
    """A per-pod /etc: passwd/group naming the pod's user, hosts, hostname."""
    etc = pod.dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    name = pod.obj["metadata"]["name"]
    passwd = "root:x:0:0:root:/root:/sbin/nologin\n"
    group = "root:x:0:\n"
    if uid != 0:
        passwd += f"user:x:{uid}:{gid}:user:/:/sbin/nologin\n"
    if gid != 0:
        group += f"user:x:{gid}:\n"
    files = {
        "passwd": passwd,
        "group": group,
        "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n",
        "hostname": name + "\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
    for fname, text in files.items():
        (etc / fname).write_text(text)
    return etc


def open_sub_path(base: str, sub_path: str, volume: str) -> int:
    """An ``O_PATH`` fd of ``base/sub_path``, walked one component at a time without following
    symlinks and created where missing. The sandbox can write the volume, so a component may be a
    symlink it planted to reach the host (CVE-2017-1002101): that refuses the exec, as the
    kubelet's "failed to prepare subPath" refuses the container."""
    fd = os.open(base, os.O_PATH | os.O_DIRECTORY)
    try:
        for part in PurePosixPath(sub_path).parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as e:
        os.close(fd)
        raise ExecRefused(
            500, f'failed to prepare subPath for volumeMount "{volume}": {e.strerror}'
        ) from None
    return fd


def sandbox_argv(
    fake: FakeKubernetes,
    pod: _Pod,
    container: dict[str, Any],
    command: list[str],
    fds: list[int],
    *,
    network: bool,
) -> list[str]:
    """The bwrap + setpriv command line for one exec in ``container`` of ``pod``; the fds it
    needs inherited are appended to ``fds`` (the caller closes them)."""
    assert BWRAP is not None and SETPRIV is not None
    obj = pod.obj
    sc = _security(obj, container)
    uid, gid = run_as(obj, container)
    name = obj["metadata"]["name"]
    argv = [
        BWRAP, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--hostname", name,
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    if not network:
        argv.append("--unshare-net")
    for d in _SYS_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    etc = _etc_dir(fake, pod, uid, gid)
    argv += ["--perms", "0755", "--dir", "/etc"]  # bwrap as root makes missing parents 0700
    for fname in ("passwd", "group", "hosts", "hostname", "nsswitch.conf"):
        argv += ["--ro-bind", str(etc / fname), f"/etc/{fname}"]
    for fname in _ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{fname}", f"/etc/{fname}"]
    if network:
        argv += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--dir", "/tmp"]
    volumes = {v["name"]: v for v in obj["spec"].get("volumes") or []}
    made = {"/", "/tmp", "/usr", "/etc", "/proc", "/dev"}
    for mount in container.get("volumeMounts") or []:  # bwrap as root makes missing parents 0700
        parent = os.path.dirname(mount["mountPath"].rstrip("/"))
        chain = []
        while parent not in made:
            chain.append(parent)
            made.add(parent)
            parent = os.path.dirname(parent)
        for d in reversed(chain):
            argv += ["--perms", "0755", "--dir", d]
    for mount in container.get("volumeMounts") or []:
        vol = volumes[mount["name"]]
        source = str(fake.volume_dir(pod, vol))
        if mount.get("subPath"):
            fd = open_sub_path(source, mount["subPath"], f"{mount['name']}")
            fds.append(fd)
            source = f"/proc/self/fd/{fd}"  # bwrap inherits the fd: it binds what was checked
        read_only = bool(mount.get("readOnly")) or bool(
            (vol.get("persistentVolumeClaim") or {}).get("readOnly")
        )
        argv += ["--ro-bind" if read_only else "--bind", str(source), mount["mountPath"]]
    if sc.get("readOnlyRootFilesystem"):
        argv += ["--remount-ro", "/"]
    argv += ["--chdir", container.get("workingDir") or "/", "--clearenv"]
    env = {"PATH": PATH, "HOSTNAME": name, "HOME": "/root" if uid == 0 else "/"}
    for item in container.get("env") or []:
        if "value" in item:  # valueFrom (secrets, field refs) is not modelled
            env[item["name"]] = str(item["value"])
    for key, value in env.items():
        argv += ["--setenv", key, value]
    groups = [int(g) for g in obj["spec"].get("securityContext", {}).get("supplementalGroups", [])]
    fs_group = (obj["spec"].get("securityContext") or {}).get("fsGroup")
    if fs_group is not None:
        groups.append(int(fs_group))
    argv += [
        "--", SETPRIV, "--reuid", str(uid), "--regid", str(gid),
        *(["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]),
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        *command,
    ]  # fmt: skip
    return argv


def exit_status(returncode: int) -> dict[str, Any]:
    """The channel-3 Status the kubelet writes when the command ends."""
    if returncode == 0:
        return {"metadata": {}, "status": "Success"}
    code = 128 - returncode if returncode < 0 else returncode  # killed by a signal: 128 + n
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def pick_container(obj: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    """The container an exec names, with the API server's errors for a missing or wrong one."""
    containers = obj["spec"]["containers"]
    name = obj["metadata"]["name"]
    if wanted is None:
        if len(containers) != 1:
            names = " ".join(c["name"] for c in containers)
            raise ExecRefused(
                400, f"a container name must be specified for pod {name}, choose one of: [{names}]"
            )
        return dict(containers[0])
    for c in containers:
        if c["name"] == wanted:
            return dict(c)
    raise ExecRefused(400, f"container {wanted} is not valid for pod {name}")


async def handle_exec(fake: FakeKubernetes, request: web.Request, pod: _Pod) -> web.StreamResponse:
    """Refuse as the API server does when the container is not running, else serve the exec."""
    phase = pod.obj["status"].get("phase")
    try:
        if phase in ("Succeeded", "Failed"):
            raise ExecRefused(
                400, f"cannot exec into a container in a completed pod; current phase is {phase}"
            )
        container = pick_container(pod.obj, request.query.get("container"))
        if phase != "Running" or "deletionTimestamp" in pod.obj["metadata"]:
            raise ExecRefused(
                400, f'unable to upgrade connection: container not found ("{container["name"]}")'
            )
        raw = fake.raw_answers.pop(_kind(request.query.getall("command", [])), None)
        if raw is not None:
            return await _serve_raw(request, raw)
        if fake.forged_answers and "-I" in request.query.getall("command", []):
            # as sandboxed code that forged engine_script's answer would make it: nothing runs
            forged = bytes([STDOUT]) + fake.forged_answers.pop(0)
            status = bytes([ERROR]) + json.dumps(exit_status(0)).encode()
            return await _serve_raw(request, frame(0x2, forged) + frame(0x2, status))
        return await serve_exec(fake, request, pod, container)
    except ExecRefused as e:
        return web.json_response(status_body(e.code, e.message), status=e.code)


def _kind(command: list[str]) -> str:
    """``files`` for a file tool's exec, ``command`` for a command's (by their CHITAL_EXEC mark)."""
    marks = [a.removeprefix("CHITAL_EXEC=") for a in command if a.startswith("CHITAL_EXEC=")]
    return "" if not marks else "files" if marks[0].startswith("files-") else "command"


def frame(opcode: int, payload: bytes, fin: bool = True, rsv: int = 0) -> bytes:
    """One unmasked server frame, as RFC 6455 lays it out (any opcode, bits and length)."""
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 2**16:
        return head + b"\x7e" + n.to_bytes(2, "big") + payload
    return head + b"\x7f" + n.to_bytes(8, "big") + payload


TERABYTE_FRAME = b"\x82\x7f" + (2**40).to_bytes(8, "big") + bytes([STDOUT]) + b"x" * 15
"""A stdout frame whose header announces 2**40 bytes, then 16 of them."""


async def _serve_raw(request: web.Request, raw: bytes) -> web.WebSocketResponse:
    """A hostile API server: the upgrade, then ``raw`` bytes as they are (frames of any shape)."""
    ws = web.WebSocketResponse(protocols=(V5, V4))
    await ws.prepare(request)
    assert request.transport is not None
    request.transport.write(raw)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            async for _ in ws:  # what the client sends (a program, on stdin) until it closes
                pass
    await ws.close()
    return ws


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill and wait. The pipes are read to their end meanwhile: asyncio counts a process as
    exited only once its pipes are closed, and a full, unread pipe is never seen closing."""

    async def drain(stream: asyncio.StreamReader | None) -> None:
        while stream is not None and await stream.read(CHUNK):
            pass

    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await asyncio.gather(drain(proc.stdout), drain(proc.stderr), proc.wait())


async def serve_exec(
    fake: FakeKubernetes, request: web.Request, pod: _Pod, container: dict[str, Any]
) -> web.StreamResponse:
    """Upgrade, run the command in a fresh sandbox, pump the channels, write the exit Status."""
    q = request.query
    command = q.getall("command", [])
    flags = {k: q.get(k, "false").lower() in ("true", "1") for k in ("stdin", "stdout", "stderr", "tty")}
    if not command:
        raise ExecRefused(400, "you must specify at least 1 command")
    if flags["tty"]:
        raise ExecRefused(400, "the fake Kubernetes server does not model tty exec")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if V5 not in offered and V4 not in offered:
        raise ExecRefused(400, "the fake speaks only v5.channel.k8s.io and v4.channel.k8s.io")
    fds: list[int] = []
    try:
        argv = sandbox_argv(fake, pod, container, command, fds, network=fake.egress_allowed(pod.obj))
        ws = web.WebSocketResponse(protocols=(V5, V4), max_msg_size=64 * 1024 * 1024, autoping=True)
        await ws.prepare(request)
        fake.exec_argvs.append(argv)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if flags["stdin"] else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
            env={"PATH": PATH},
            start_new_session=True,
            pass_fds=fds,
        )
    finally:
        for fd in fds:
            os.close(fd)
    v5 = ws.ws_protocol == V5
    pod.procs.add(proc)

    async def pump(stream: asyncio.StreamReader, channel: int, wanted: bool) -> None:
        while chunk := await stream.read(CHUNK):
            if wanted:  # a channel the client did not ask for is read and dropped
                await ws.send_bytes(bytes([channel]) + chunk)

    async def receive() -> None:
        async for msg in ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDIN and proc.stdin is not None and not proc.stdin.is_closing():
                with contextlib.suppress(ConnectionError):
                    proc.stdin.write(payload)
                    await proc.stdin.drain()  # backpressure: stop reading the socket meanwhile
            elif channel == CLOSE and v5 and payload[:1] == bytes([STDIN]) and proc.stdin is not None:
                proc.stdin.close()

    async def finish() -> int:
        assert proc.stdout is not None and proc.stderr is not None
        await asyncio.gather(
            pump(proc.stdout, STDOUT, flags["stdout"]), pump(proc.stderr, STDERR, flags["stderr"])
        )
        return await proc.wait()

    receiving = asyncio.create_task(receive())
    finishing = asyncio.create_task(finish())
    try:
        await asyncio.wait({receiving, finishing}, return_when=asyncio.FIRST_COMPLETED)
        if not finishing.done():  # the client went away first: the process goes with it
            fake.exec_abandoned += 1
            finishing.cancel()
            await _reap(proc)
        else:
            code = finishing.result()
            with contextlib.suppress(ConnectionError):
                await ws.send_bytes(
                    bytes([ERROR]) + json.dumps(exit_status(code), separators=(",", ":")).encode()
                )
    except ConnectionError:  # the client went away while output was being sent
        fake.exec_abandoned += 1
        await _reap(proc)
    finally:
        if proc.returncode is None:  # cancelled (the server stops): nothing outlives the exec
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        receiving.cancel()
        if not finishing.done():
            finishing.cancel()
        pod.procs.discard(proc)
        if proc.stdin is not None:
            proc.stdin.close()
        await ws.close()
    return ws
