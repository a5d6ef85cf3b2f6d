"""kube_spec.py and the provider's error text, without a server: the settings a pod is made from
change its hash (so a daemon of other settings replaces it), and no credential reaches an error."""

from __future__ import annotations

import json
from typing import Any

from agent.sandbox import SandboxLimits
from agent.sandbox import kube_spec as ks
from agent.sandbox.kube_exec import api_problem


def _spec(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "image": "img",
        "limits": SandboxLimits(),
        "uid": 1000,
        "gid": 1000,
        "runtime_class": None,
    }
    return ks.pod_spec("t", **(args | kw))


def test_every_setting_a_pod_is_made_from_changes_its_hash() -> None:
    base = ks.spec_hash(_spec(), False)
    assert ks.spec_hash(_spec(), False) == base
    others = [
        ks.spec_hash(_spec(image="img2"), False),
        ks.spec_hash(_spec(limits=SandboxLimits(memory_mb=2048)), False),
        ks.spec_hash(_spec(uid=1001), False),
        ks.spec_hash(_spec(runtime_class="gvisor"), False),
        ks.spec_hash(_spec(), True),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert _spec(runtime_class="gvisor")["runtimeClassName"] == "gvisor"
    assert "runtimeClassName" not in _spec()


def test_names_are_valid_whatever_the_thread_id() -> None:
    tid = "slack:T1/../ü x\n;$(id)" * 20
    for name in (ks.pod_name(tid), ks.claim_name(tid)):
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name.islower()
    assert ks.claim(tid, "2Gi", "fast")["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "fast",
    }
    assert ks.claim(tid, "1Gi", None)["metadata"]["annotations"] == {ks.THREAD: tid}


class _ApiException(Exception):
    """The shape of kubernetes.client.rest.ApiException (status, reason, body, headers)."""

    def __init__(
        self, status: int, reason: str, body: str = "", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"({status}) Reason: {reason} HTTP response headers: {headers} body: {body}")
        self.status, self.reason, self.body, self.headers = status, reason, body, headers


def test_errors_carry_the_status_and_message_never_a_credential() -> None:
    token = "tok-ABCDEF123456"
    e = _ApiException(401, "Unauthorized", '{"message": "Unauthorized"}', {"Www-Authenticate": token})
    text = api_problem(e, "cannot make the sandbox pod p", (token,))
    assert "401 Unauthorized" in text and token not in text
    echoed = _ApiException(500, "Internal", '{"message": "bad bearer ' + token + '"}')
    text = api_problem(echoed, "x", (token,))
    assert "500" in text and token not in text and "[redacted]" in text
    # The websocket handshake's failure comes as status 0 with the response in the reason.
    hs = _ApiException(0, f"Handshake status 403 Forbidden -+-+- {{'authorization': 'Bearer {token}'}}")
    text = api_problem(hs, "exec in the sandbox pod p")
    assert "403 Forbidden" in text and token not in text and "Bearer" not in text
    down = _ApiException(0, "[Errno 111] Connection refused")
    assert "unreachable" in api_problem(down, "x")


def test_a_malformed_exit_status_from_the_api_is_no_status_not_a_crash() -> None:
    """The channel-3 Status is the API server's (or whatever answers in its place): a shape it
    should not have is "no exit status known", never an exception out of the command's result."""
    from agent.sandbox.kube_exec import ExecStream

    for status in (
        {"status": "Failure", "details": "x"},
        {"status": "Failure", "details": {"causes": "x"}},
        {"status": "Failure", "details": {"causes": ["x", None, 3]}},
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": [1]}]}},
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "1e999"}]}},
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "9" * 5000}]}},
        {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "\u0663"}]}},
    ):
        s = ExecStream(None, None)
        s._status += json.dumps(status).encode()  # the bytes channel 3 brought
        assert s.exit_code() is None, status
    s = ExecStream(None, None)
    s._status += b'{"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}'
    assert s.exit_code() == 3
