"""A fake ACP agent that speaks the protocol (JSON-RPC 2.0, one JSON object per line) on stdio.

Standard library only: it runs *inside* the sandbox, with the system's /usr/bin/python3, where
the daemon's site-packages (and so the SDK) are not visible. Tests start it as
``/usr/bin/python3 -c <this file's text>`` and script it through ``FAKE_ACP_SCRIPT`` (JSON) in the
agent's configured environment, which also shows that environment reaches the agent:

``{"init": "answer" | "silent" | "crash" | "malformed", "steps": [...]}``; steps run at ``session/prompt``:

- ``{"say": text}``: an ``agent_message_chunk``
- ``{"tool": title}`` / ``{"plan": [texts]}``: a ``tool_call`` (then its completion) / a plan
- ``{"ask": title}``: ``session/request_permission``; the answer decides the next ``write``
- ``{"asks": n}``: n ``session/request_permission`` sent at once, then their answers awaited
- ``{"ask_then_exit": title, "when": path}``: a permission request, then (without its answer)
  exits once ``path`` exists: the test makes it when the prompt shows
- ``{"wait_for": path}``: waits (at most 120 s) until ``path`` exists
- ``{"reads": n, "path": path}``: n ``fs/read_text_file`` sent at once, then never reads its
  stdin again (their answers pile up on our side unless we wait for it)
- ``{"write": path, "content": text, "if_allowed": bool}``: ``fs/write_text_file``
- ``{"read": path}``: ``fs/read_text_file``; the content (or error) is said back
- ``{"cwd": true}``: says its working directory
- ``{"symlink": [target, link]}``: plants a symlink (inside the sandbox)
- ``{"env": [names]}``: says which of those variables it sees, and the whole environment's names
- ``{"flood": n}``: n updates as fast as it can
- ``{"crash": code}``: exits at once
- ``{"open": path}`` / ``{"connect": [host, port]}``: tries it itself, says what happened
- ``{"garbage": n}``: n lines that are not JSON
- ``{"big": n}``: one message of n bytes (past the client's line limit)
- ``{"hang": true}``: waits for ``session/cancel`` (answers the prompt ``cancelled`` then), or
  ``{"hang": "forever"}``: ignores it; both first start a child shell with ``marker`` in argv;
  ``"note": path`` writes there when the cancel came
"""

import json
import os
import subprocess
import sys

SCRIPT = json.loads(os.environ.get("FAKE_ACP_SCRIPT") or "{}")
_next_id = [1000]
_cancelled = [False]


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)


def update(session, body):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": body}})


def say(session, text):
    update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def call(method, params):
    """A request to the client; waits for its answer (a cancel meanwhile is remembered)."""
    _next_id[0] += 1
    rid = _next_id[0]
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    while True:
        msg = read()
        if msg.get("id") == rid and "method" not in msg:
            return msg
        if msg.get("method") == "session/cancel":
            _cancelled[0] = True


def run_prompt(session):
    allowed = True
    for step in SCRIPT.get("steps", []):
        if "say" in step:
            say(session, step["say"])
        elif "tool" in step:
            update(
                session,
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": "t1",
                    "title": step["tool"],
                    "kind": "edit",
                    "status": "in_progress",
                },
            )
            update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"})
        elif "plan" in step:
            entries = [{"content": t, "priority": "medium", "status": "pending"} for t in step["plan"]]
            update(session, {"sessionUpdate": "plan", "entries": entries})
        elif "ask" in step:
            answer = call(
                "session/request_permission",
                {
                    "sessionId": session,
                    "toolCall": {
                        "toolCallId": "p1",
                        "title": step["ask"],
                        "kind": "edit",
                        "rawInput": {"file": step.get("file", "")},
                    },
                    "options": [
                        {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            )
            outcome = (answer.get("result") or {}).get("outcome") or {}
            allowed = outcome.get("outcome") == "selected" and outcome.get("optionId") == "yes"
            say(session, f"[permission {'granted' if allowed else 'refused'}] ")
        elif "asks" in step:  # a flood: every request out before any answer is read
            first = _next_id[0] + 1
            for i in range(int(step["asks"])):
                _next_id[0] += 1
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": _next_id[0],
                        "method": "session/request_permission",
                        "params": {
                            "sessionId": session,
                            "toolCall": {"toolCallId": f"p{i}", "title": f"flood ask {i}", "kind": "edit"},
                            "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}],
                        },
                    }
                )
            waiting = set(range(first, _next_id[0] + 1))
            while waiting:
                waiting.discard(read().get("id"))
            say(session, "[asks answered] ")
        elif "reads" in step:
            import time

            for _ in range(int(step["reads"])):
                _next_id[0] += 1
                params = {"sessionId": session, "path": step["path"]}
                send({"jsonrpc": "2.0", "id": _next_id[0], "method": "fs/read_text_file", "params": params})
            time.sleep(3600)
        elif "wait_for" in step:
            import time

            for _ in range(1200):
                if os.path.exists(step["wait_for"]):
                    break
                time.sleep(0.1)
        elif "ask_then_exit" in step:
            import time

            _next_id[0] += 1
            send(
                {
                    "jsonrpc": "2.0",
                    "id": _next_id[0],
                    "method": "session/request_permission",
                    "params": {
                        "sessionId": session,
                        "toolCall": {"toolCallId": "px", "title": step["ask_then_exit"], "kind": "execute"},
                        "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}],
                    },
                }
            )
            for _ in range(1200):
                if os.path.exists(step["when"]):
                    break
                time.sleep(0.1)
            os._exit(3)
        elif "write" in step:
            if step.get("if_allowed") and not allowed:
                say(session, "[not written] ")
                continue
            answer = call(
                "fs/write_text_file",
                {"sessionId": session, "path": step["write"], "content": step.get("content", "")},
            )
            say(session, "[write error] " if "error" in answer else "[written] ")
        elif "read" in step:
            answer = call("fs/read_text_file", {"sessionId": session, "path": step["read"]})
            if "error" in answer:
                say(session, "[read error] ")
            else:
                say(session, "[read: " + answer["result"]["content"][:200] + "] ")
        elif "cwd" in step:
            say(session, "[cwd " + os.getcwd() + "] ")
        elif "symlink" in step:
            target, link = step["symlink"]
            os.symlink(target, link)
        elif "env" in step:
            seen = {n: os.environ.get(n, "") for n in step["env"]}
            say(session, "[env " + json.dumps(seen) + " names " + json.dumps(sorted(os.environ)) + "] ")
        elif "flood" in step:
            for i in range(int(step["flood"])):
                say(session, f"flood {i} ")
        elif "open" in step:  # straight from its own sandbox, not through the client
            try:
                with open(step["open"]) as f:
                    say(session, "[opened: " + f.read(100) + "] ")
            except OSError as e:
                say(session, f"[open error {e.errno}] ")
        elif "connect" in step:
            import socket

            try:
                socket.create_connection(tuple(step["connect"]), timeout=3).close()
                say(session, "[connected] ")
            except OSError as e:
                say(session, f"[connect error {e.errno}] ")
        elif "garbage" in step:
            for _ in range(int(step["garbage"])):
                sys.stdout.write("this is not json {\n")
            sys.stdout.flush()
        elif "big" in step:
            say(session, "x" * int(step["big"]))
        elif "crash" in step:
            os._exit(int(step["crash"]))
        elif "hang" in step:
            marker = step.get("marker", "ACP_CHILD")
            subprocess.Popen(["/bin/sh", "-c", f"sleep 3600; true {marker}"])
            while step["hang"] == "forever" or not _cancelled[0]:
                msg = read()
                if msg.get("method") == "session/cancel":
                    _cancelled[0] = True
            if step.get("note"):  # proof, on the host, that session/cancel arrived
                with open(step["note"], "w") as f:
                    f.write("session/cancel received")
            return "cancelled"
    return "end_turn"


def main():
    init = SCRIPT.get("init", "answer")
    session = "sess-1"
    while True:
        msg = read()
        method, rid = msg.get("method"), msg.get("id")
        if method == "initialize":
            if init == "silent":
                continue
            if init == "crash":
                os._exit(7)
            if init == "malformed":
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "result": {"protocolVersion": "one", "agentCapabilities": 3},
                    }
                )
                continue
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []},
                }
            )
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": session, "cwd": msg["params"]["cwd"]}})
        elif method == "session/prompt":
            reason = run_prompt(session)
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": reason}})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})


def agent_entry(script, marker="fake-acp", **extra):
    """An ``agent.acp_agents`` entry (a config dict) that starts this fake with ``script``; the
    ``marker`` in its argv lets a test find its processes. For tests, never run inside the fake."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    env = {"FAKE_ACP_SCRIPT": json.dumps(script), **extra.pop("env", {})}
    return {"command": "/usr/bin/python3", "args": ["-c", source, marker], "env": env, **extra}


if __name__ == "__main__":
    main()
