"""The ``kubernetes`` provider attacked, against the fake API server (fixtures ``k8s`` and ``make``
in tests/conftest.py): what sandboxed code plants in its own files, what a hostile API server
answers, and faults at the worst moment."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sandbox import SandboxLimits, SandboxUnavailable, kubernetes_provider
from agent.sandbox import kube_spec as ks
from agent.sandbox.backend import SandboxBackend
from agent.sandbox.paths import SandboxError
from tests.fakes import kubernetes_exec as kexec
from tests.fakes.canary_server import Canary
from tests.fakes.kubernetes_server import FakeKubernetes
from tests.kubernetes_support import NS, WS, Make, thread_id

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="the fake API server runs each pod as a bubblewrap sandbox, started as root",
)


async def test_a_link_to_an_unreadable_directory_does_not_block_the_thread(make: Make) -> None:
    """The disk-usage walk (engine_script.op_usage) never follows a link: one pointing at a
    directory the sandbox user cannot read (``ln -s /root``) is a link of a few bytes, not an
    unreadable directory of the thread's that blocks its commands and writes until removed."""
    sb = await make().acquire(thread_id())
    res = await sb.exec("mkdir /tmp/locked && chmod 000 /tmp/locked && ln -s /tmp/locked locked && echo made")
    assert res.output.strip() == "made", res
    assert (await sb.exec("echo still")).output.startswith("still")
    await sb.write_file(f"{WS}/after.txt", "written\n")
    assert (await sb.read_file("after.txt")).text == "written\n"
    # A directory of the thread's own that it made unreadable still counts as unmeasurable.
    res = await sb.exec("mkdir mine && chmod 000 mine && echo made")
    assert "not readable" in res.output, res


@pytest.fixture
def tarpit() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never answers (a stalled API server)."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    for s in held:
        s.close()
    srv.close()


async def test_a_stalled_api_server_fails_the_call_instead_of_hanging_it(
    make: Make, k8s: FakeKubernetes, tarpit: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every REST call and every exec connect has a deadline: an API server (or a proxy in front of
    it) that accepts and never answers fails the call with a specific error, rather than holding a
    worker thread, the thread's lock and (for an exec's connect) every other thread's execs."""
    monkeypatch.setattr(kubernetes_provider, "API_SECONDS", 1.0)
    config = k8s.write_kubeconfig(tmp_path / "stalled")
    data = json.loads(config.read_text())
    data["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{tarpit}"
    config.write_text(json.dumps(data))
    p = make(kubeconfig=config)
    with pytest.raises(SandboxUnavailable) as err:
        await asyncio.wait_for(p.acquire(thread_id()), 90)
    assert "unreachable" in str(err.value), err.value
    with pytest.raises(SandboxError) as err2:
        await asyncio.wait_for(asyncio.to_thread(p.files_for(thread_id()).ls, WS), 90)
    assert "unreachable" in str(err2.value), err2.value


async def test_a_deny_policy_of_other_content_under_our_name_is_put_right(
    make: Make, k8s: FakeKubernetes, canary: Canary, tmp_path: Path
) -> None:
    """Network deny by default does not rest on a name alone: a NetworkPolicy already called
    ``chital-sandbox-deny`` that selects nothing (an older release's, an operator's edit, a typo)
    is replaced by ours when the daemon finds it, before any pod runs without network."""
    from kubernetes import client, config

    def plant() -> None:
        api = config.new_client_from_config(config_file=str(k8s.write_kubeconfig(tmp_path / "op")))
        body = ks.deny_policy()
        body["spec"]["podSelector"] = {"matchLabels": {"nothing": "selected"}}
        client.NetworkingV1Api(api).create_namespaced_network_policy(NS, body)
        api.close()

    await asyncio.to_thread(plant)
    sb = await make().acquire(thread_id())
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {canary.port}), 5); print('connected')\""
    res = await sb.exec(probe)
    assert res.exit_code != 0 and "connected" not in res.output, res
    assert canary.connections == 0
    assert k8s.objects["networkpolicies"][(NS, ks.DENY_POLICY)]["spec"] == ks.deny_policy()["spec"]


async def test_a_full_namespace_quota_says_so_not_the_role(make: Make, k8s: FakeKubernetes) -> None:
    """Many threads make many pods and claims; the bound is the namespace's ResourceQuota
    (docs/scale-out.md). When it is reached the error says so, not "see the Role"."""
    quota = 'pods "chital-sbx-1" is forbidden: exceeded quota: sandboxes, requested: count/pods=1, used: count/pods=50, limited: count/pods=50'
    k8s.fail("create", "pods", 403, message=quota)
    with pytest.raises(SandboxUnavailable) as err:
        await make().acquire(thread_id())
    text = str(err.value)
    assert "ResourceQuota" in text and "count/pods=50" in text and "Role" not in text, text


async def test_names_with_newlines_quotes_and_nuls_reach_engine_script_intact_or_refused(make: Make) -> None:
    """File names travel as exec arguments in the request URL: a newline, quotes, a leading dash,
    ``@`` (the stdin-chunk marker) or non-ASCII arrive as one argument each; a NUL is refused."""
    sb = await make().acquire(thread_id())
    odd = ["a\nb.txt", "-rf", "@5", "q'\"$(id).txt", "ü \u202e.txt"]
    for name in odd:
        await sb.write_file(f"{WS}/{name}", f"content of {name!r}")
    for name in odd:
        assert (await sb.read_file(f"{WS}/{name}")).text == f"content of {name!r}"
    assert sorted(e.path for e in await sb.ls(WS)) == sorted(f"{WS}/{n}" for n in odd)
    with pytest.raises(SandboxError):
        await sb.write_file(f"{WS}/nul\x00.txt", "x")


async def test_a_mount_dir_swapped_for_a_link_is_refused_by_every_file_tool(make: Make) -> None:
    """The workspace is a plain directory of the claim, so sandboxed code can swap it for a link
    (to /etc, or to a FIFO): every file tool refuses it, and the quota walk skips it."""
    sb = await make().acquire(thread_id())
    res = await sb.exec(
        "cd .. && mv workspace old && ln -s /etc workspace && mkfifo uploads/f && echo swapped"
    )
    assert res.output.startswith("swapped"), res
    for call in (
        sb.read_file(f"{WS}/passwd"),
        sb.write_file(f"{WS}/x", "x"),
        sb.ls(WS),
        sb.delete(f"{WS}/passwd"),
        sb.read_file("/mnt/user-data/uploads/f"),
    ):
        with pytest.raises(SandboxError):
            await call
    assert await sb.glob("**/passwd", "/mnt/user-data") == []
    assert await sb.grep("root:", "/mnt/user-data") == []
    assert (await sb.exec("echo still")).output.startswith("still")


async def test_the_api_token_reaches_no_pod_argv_error_or_log(
    make: Make, k8s: FakeKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's API token is in no pod (spec, environment, files), no exec's argv, and no
    error text or log line, even when an API (or a proxy before it) echoes it in its message."""
    caplog.set_level("DEBUG")
    p = make()
    tid = thread_id()
    sb = await p.acquire(tid)
    res = await sb.exec(
        "env; cat /proc/self/environ; ls -a /var/run/secrets 2>&1; grep -rl . /mnt 2>/dev/null"
    )
    await sb.write_file(f"{WS}/f.txt", "x")
    assert k8s.token not in res.output
    assert k8s.token not in json.dumps(k8s.pod(ks.pod_name(tid)))
    assert not any(k8s.token in " ".join(a) for a in k8s.exec_argvs)
    k8s.fail("create", "pods", 403, message=f"forbidden for Bearer {k8s.token}")
    k8s.fail("get", "pods", 500, message=f"upstream said Authorization: Bearer {k8s.token}")
    with pytest.raises(SandboxUnavailable) as err:
        await p.acquire(thread_id())
    assert k8s.token not in str(err.value) and "[redacted]" in str(err.value), err.value
    assert k8s.token not in caplog.text


async def test_a_token_rotated_on_one_client_only_is_still_redacted(make: Make, k8s: FakeKubernetes) -> None:
    """The REST and the exec clients each refresh their token (in-cluster, a projected token
    rotates): every token either holds is cut from errors, not only the exec client's."""
    p = make()
    await p.acquire(thread_id())
    assert p._clients is not None
    p._clients[3].configuration.api_key = {"authorization": "Bearer an-older-token"}  # rotated apart
    k8s.fail("get", "pods", 500, message=f"upstream said Authorization: Bearer {k8s.token}")
    with pytest.raises(SandboxUnavailable) as err:
        await p.acquire(thread_id())
    assert k8s.token not in str(err.value), err.value


async def test_modules_planted_in_the_workspace_do_not_forge_the_file_tools_answers(make: Make) -> None:
    """engine_script runs as ``python3 -I``: a ``usercustomize.py`` the sandboxed code plants in
    its user site (under HOME, the workspace) or a ``json.py`` beside it is never imported, so it
    cannot print an answer of its own ahead of the script's."""
    sb = await make().acquire(thread_id())
    forged = json.dumps({"entries": [["FORGED", False, 1, 0]]})
    code = f"import sys; sys.stdout.write({forged!r} + chr(10)); sys.stdout.flush()"
    site = (await sb.exec("python3 -c 'import site; print(site.getusersitepackages())'")).output.strip()
    assert site.startswith(WS + "/"), site
    for where in (site, WS):
        for module in ("usercustomize", "sitecustomize", "json"):
            await sb.write_file(f"{where}/{module}.py", code)
    res = await sb.exec("python3 -c pass")
    assert res.output.startswith(forged), res  # the plant works on a python3 without -I
    names = [e.path.rsplit("/", 1)[-1] for e in await sb.ls(WS)]
    assert "FORGED" not in names and "json.py" in names, names


async def test_a_pod_of_another_thread_under_the_same_name_is_refused(
    make: Make, k8s: FakeKubernetes, tmp_path: Path
) -> None:
    """Names are 64 bits of a hash: should two thread ids ever meet on one (or a pod be made by
    hand under a sandbox's name), the pod's ``chital/thread`` says whose it is, and a thread
    never runs in, or reads the files of, a pod made for another."""
    from kubernetes import client, config

    tid, other = thread_id("mine"), thread_id("other")
    spec = ks.pod_spec(
        other, image="chital-sandbox:test", limits=SandboxLimits(), uid=1000, gid=1000, runtime_class=None
    )
    theirs = ks.pod(other, spec, False)
    theirs["metadata"]["name"] = ks.pod_name(tid)
    theirs["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = ks.claim_name(tid)
    claim = ks.claim(other, "1Gi", None)
    claim["metadata"]["name"] = ks.claim_name(tid)

    def plant() -> None:
        api = config.new_client_from_config(config_file=str(k8s.write_kubeconfig(tmp_path / "op")))
        core = client.CoreV1Api(api)
        core.create_namespaced_persistent_volume_claim(NS, claim)
        core.create_namespaced_pod(NS, theirs)
        api.close()

    await asyncio.to_thread(plant)
    p = make()
    with pytest.raises(SandboxUnavailable) as err:
        await p.acquire(tid)
    assert "another thread" in str(err.value), err.value
    k8s._on_loop(lambda: k8s.objects["pods"].clear())
    with pytest.raises(SandboxUnavailable) as err:
        await p.acquire(tid)  # the pod gone, the claim still another thread's
    assert "another thread" in str(err.value), err.value


async def test_long_commands_do_not_take_the_daemons_worker_threads(make: Make, k8s: FakeKubernetes) -> None:
    """A running command's output is read by a blocking client for as long as it runs: on the
    loop's default executor (min(32, cores + 4) threads), a few long commands in a few threads
    would hold every worker the rest of the daemon's ``to_thread`` calls need."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    small = ThreadPoolExecutor(max_workers=3)  # a small machine's default executor, busy
    loop.set_default_executor(small)
    p = make()
    boxes = [await p.acquire(thread_id(str(n))) for n in range(3)]
    runs = [asyncio.ensure_future(sb.exec("echo started; sleep 600", timeout=600)) for sb in boxes]
    try:
        while sum("630" in a for a in k8s.exec_argvs) < len(boxes):  # the in-pod timeout: 600 + 30
            await asyncio.sleep(0.05)  # each command's exec has reached its pod
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 60) == "free"
        assert (await asyncio.wait_for(boxes[0].exec("echo meanwhile"), 60)).output == "meanwhile\n"
    finally:
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


FORGED_ANSWERS = [
    ("ls", b'{"entries": [["a", false, "big", 0]]}'),
    ("ls", b'{"entries": [["a", false]]}'),
    ("ls", b'{"entries": 5}'),
    ("ls", b'{"entries": [["a", false, 1e999, 0]]}'),
    ("ls", b"[" * 100_000),
    ("ls", b'"a string"'),
    ("stat", b'{"entry": [true, "x", 0]}'),
    ("stat", b'{"entry": 7}'),
    ("read", b'{"size": "many"}'),
    ("read", b'{"size": [1]}'),
    ("grep", b'{"matches": [["f", "x", "t"]]}'),
    ("grep", b'{"matches": [1]}'),
    ("glob", b'{"files": 3}'),
    ("write", b'{"blocks": "x", "files": 0}'),
    ("write", b'{"blocks": -4096, "files": 0}'),  # a negative size would pass the quota
    ("ls", b'{"entries": [["a", false, 1' + b"0" * 400 + b", 0]]}"),  # overflows a division later
    ("read", b'{"size": -1}'),
    ("stat", b'{"entry": [false, 1, NaN]}'),
]


@pytest.mark.parametrize(
    ("op", "answer"), FORGED_ANSWERS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(FORGED_ANSWERS)]
)
async def test_a_forged_file_tool_answer_of_the_wrong_shape_is_refused_by_name(
    make: Make, k8s: FakeKubernetes, op: str, answer: bytes
) -> None:
    """engine_script runs as the sandbox user beside sandboxed code, which can forge what it prints
    (a line written to /proc/PID/fd/1 ahead of its own). An answer of the wrong shape is refused with the reason the model
    can act on, never a TypeError or ValueError out of the tool; the next operation is answered."""
    sb = await make().acquire(thread_id())
    await sb.write_file(f"{WS}/real.txt", "real\n")
    k8s.forged_answers.append(answer + b"\n")
    calls = {
        "ls": lambda: sb.ls(WS),
        "stat": lambda: sb.stat(f"{WS}/real.txt"),
        "read": lambda: sb.read_bytes(f"{WS}/real.txt"),
        "grep": lambda: sb.grep("real", WS),
        "glob": lambda: sb.glob("*.txt", WS),
        "write": lambda: sb.write_file(f"{WS}/new.txt", "new\n"),
    }
    with pytest.raises(SandboxError, match="the file operation gave an unreadable answer"):
        await calls[op]()
    assert not k8s.forged_answers  # the forged answer was the one read
    assert [e.path for e in await sb.ls(WS) if e.path.endswith(".txt")] == [f"{WS}/real.txt"]


async def test_a_frame_announcing_a_terabyte_is_cut_at_its_header(make: Make, k8s: FakeKubernetes) -> None:
    """A hostile API server announces a 2**40-byte frame: websocket-client would gather it in
    memory (or wait for it until the command's timeout); the header is refused at once, the
    command's result says where its output was cut, a file tool fails by name, and the next
    command runs."""
    sb = await make().acquire(thread_id())

    def killers() -> int:
        return sum(any(a.startswith("CHITAL_EXEC=killer-") for a in argv) for argv in k8s.exec_argvs)

    k8s.raw_answers["command"] = kexec.TERABYTE_FRAME
    async with asyncio.timeout(30):  # the command's own timeout is 120 s: refused, not waited out
        res = await sb.exec("echo never", timeout=120)
    assert "over 4 MB; cut there; the command was killed" in res.output and not k8s.raw_answers, res
    assert killers() == 1  # a cut stream does not stop a real exec: the command is killed by marker
    k8s.raw_answers["files"] = kexec.TERABYTE_FRAME
    with pytest.raises(SandboxError, match="FrameTooLarge"):
        await sb.ls(WS)
    assert (await sb.exec("echo after")).output.startswith("after")


async def test_a_forged_walk_cannot_point_outside_and_a_far_future_mtime_is_left_out(
    make: Make, k8s: FakeKubernetes
) -> None:
    """What passes the shape checks is still held to meaning: a search result that is an absolute
    path or climbs out is dropped (posixpath.join would drop the mount's prefix), a created name of
    ``..`` is refused, and an mtime of year 11476 (tmpfs keeps what ``touch -d @300000000000``
    sets, no forging needed) leaves the listing's time out instead of failing the listing."""
    sb = await make().acquire(thread_id())
    k8s.forged_answers.append(b'{"files": ["/etc/passwd", "../up.txt", "", "fine.txt"]}\n')
    assert await sb.glob("*", WS) == [f"{WS}/fine.txt"]
    k8s.forged_answers.append(b'{"name": ".."}\n')
    with pytest.raises(SandboxError, match="could not be created"):
        await asyncio.to_thread(sb.files.create_unique, "/mnt/user-data/uploads", "x.txt", b"x")
    k8s.forged_answers.append(b'{"entries": [["far.txt", false, 3, 300000000000]]}\n')
    listing = await asyncio.to_thread(SandboxBackend(sb).ls, WS)
    assert listing.error is None and listing.entries == [
        {"path": f"{WS}/far.txt", "is_dir": False, "size": 3}
    ]


OUT, ERR = bytes([kexec.STDOUT]), bytes([kexec.ERROR])
SUCCESS = ERR + b'{"status":"Success"}'
BROKEN_STREAMS = {
    "reserved opcode": kexec.frame(0x3, OUT + b"x"),
    "reserved bit": kexec.frame(0x2, OUT + b"x", rsv=4),
    "fragmented ping": kexec.frame(0x9, b"p", fin=False),
    "continuation out of nowhere": kexec.frame(0x2, OUT + b"a") + kexec.frame(0x0, b"b"),
    "message inside a message": kexec.frame(0x2, OUT + b"a", fin=False) + kexec.frame(0x2, OUT + b"b"),
}


@pytest.mark.parametrize("raw", BROKEN_STREAMS.values(), ids=BROKEN_STREAMS.keys())
async def test_an_exec_stream_that_breaks_the_protocol_is_cut_and_its_command_killed(
    make: Make, k8s: FakeKubernetes, raw: bytes
) -> None:
    """A frame websocket-client's own checks refuse, or one the channel protocol cannot place (a
    continuation after a whole message would be read as more of it: a stray one after the Status
    rewrote the exit code): the stream is cut, the command killed, the result says so, and a
    file tool fails by name."""
    sb = await make().acquire(thread_id())
    k8s.raw_answers["command"] = raw + SUCCESS
    res = await sb.exec("echo never")
    assert "broke the websocket protocol" in res.output or "a message" in res.output, res
    assert "the command was killed" in res.output and res.exit_code is None, res
    k8s.raw_answers["files"] = raw
    with pytest.raises(SandboxError, match="StreamBroken"):
        await sb.ls(WS)
    assert (await sb.exec("echo after")).output.startswith("after")


async def test_a_status_in_fragments_still_gives_the_exit_code(make: Make, k8s: FakeKubernetes) -> None:
    """RFC 6455 lets a message come in fragments, a ping between them: the Status is read whole."""
    sb = await make().acquire(thread_id())
    status = b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}'
    k8s.raw_answers["command"] = (
        kexec.frame(0x2, OUT + b"out\n")
        + kexec.frame(0x2, ERR + status[:20], fin=False)
        + kexec.frame(0x9, b"ping")
        + kexec.frame(0x0, status[20:])
        + kexec.frame(0x8, (1000).to_bytes(2, "big"))
    )
    res = await sb.exec("echo never")
    assert (res.output, res.exit_code) == ("out\n", 7), res


async def test_a_tree_a_thousand_levels_deep_does_not_lock_the_thread(make: Make) -> None:
    """``os.fwalk`` recurses: sandboxed code's 1,200-level tree made the quota's walk die with no
    answer, so every later command and write was refused and nothing could remove it. Now the quota
    counts what it reached, commands and writes go on, a search or delete that meets the tree says
    what to do, and once removed the tools work again."""
    sb = await make().acquire(thread_id())
    made = await sb.exec(
        "python3 -c \"import os\nfor _ in range(1200): os.mkdir('d'); os.chdir('d')\nopen('x.txt', 'w')\""
        " && mkdir deep && mv d deep/ && echo made"
    )
    assert made.output.strip().endswith("made"), made
    assert (await sb.exec("echo still")).output.startswith("still")
    await sb.write_file(f"{WS}/after.txt", "written\n")
    with pytest.raises(SandboxError, match=r"about 1000 levels deep is in the way; remove it with execute"):
        await sb.glob("**/*.txt", WS)
    with pytest.raises(SandboxError, match=r"remove it with execute \(rm -rf DIR\)"):
        await sb.delete(f"{WS}/deep")
    assert (await sb.exec("rm -rf deep && echo gone")).output.startswith("gone")
    assert await sb.glob("**/*.txt", WS) == [f"{WS}/after.txt"]


async def test_a_text_file_over_the_read_cap_shows_its_first_lines(make: Make) -> None:
    """A 75 MB log read as text showed as empty (0 lines): the program sent nothing past its cap.
    Now read_file shows its first lines (its total unknown, as on host dirs) and a whole-file read
    is still refused by size."""
    sb = await make(limits=SandboxLimits(memory_mb=256, disk_mb=100)).acquire(thread_id())
    made = await sb.exec("python3 -c \"open('big.log', 'w').write('line\\n' * 15_000_000)\" && echo made")
    assert made.output.strip() == "made", made
    window = await sb.read_file("big.log", limit=2)
    assert (window.text, window.start_line, window.end_line) == ("line\nline\n", 1, 2), window
    with pytest.raises(SandboxError, match="larger than"):
        await sb.read_bytes("big.log", 1024 * 1024)


async def test_entries_that_are_not_regular_files_count_against_the_walk_and_the_listing(
    make: Make,
) -> None:
    """The walk counted and timed regular files only, and ``ls`` did not count what it left out:
    a directory of dangling links (2 M of them took a listing 85 s and answered "empty", not cut)
    is now cut at four times the cap, and said to be."""
    from agent.sandbox import bounded

    sb = await make().acquire(thread_id())
    n = bounded.MAX_LS_LOOKED + 10
    made = await sb.exec(
        f"mkdir links && cd links && python3 -c \"import os\nfor i in range({n}): os.symlink('/nowhere', str(i))\""
        " && echo made"
    )
    assert made.output.strip() == "made", made
    listing = await sb.ls(f"{WS}/links")
    assert [e.path for e in listing] == [
        f"{WS}/links/[listing cut at {bounded.MAX_LS_ENTRIES} entries; use glob or execute]"
    ]


async def test_deleting_a_link_in_the_pod_removes_the_link_not_its_target(make: Make) -> None:
    """As on host dirs: the delete tool removes a link, not the file it points at, and a link
    pointing out of the mount can be deleted (it was refused as an escape)."""
    sb = await make().acquire(thread_id())
    made = await sb.exec(
        "echo keep > important.txt && ln -s important.txt link && ln -s /etc/passwd out && echo made"
    )
    assert made.output.strip() == "made", made
    for name in ("link", "out"):
        assert await sb.delete(f"{WS}/{name}") == f"{WS}/{name}"
    left = await sb.exec("ls -A && cat important.txt")
    assert left.output.split() == ["important.txt", "keep"], left
