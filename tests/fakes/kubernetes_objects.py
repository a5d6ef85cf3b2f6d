"""Pieces of the Kubernetes API that the fake API server (tests/fakes/kubernetes_server.py) shares:
Status error bodies, label selectors, the three PATCH dialects, names, timestamps and a throwaway TLS
authority. Kept apart so the server module stays about the resources and their lifecycle.

Wire facts follow the real API server (k8s.io/apimachinery): a failed request answers a ``Status``
object whose ``reason`` and ``code`` the official client turns into ``ApiException(status=code)``.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import re
import secrets
from pathlib import Path
from typing import Any

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's utilrand alphabet


class ApiError(Exception):
    """Raised by the fake's handlers; answered as a ``Status`` with this code."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.reason, self.details = code, message, reason, details


def status_body(
    code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``Status`` object the API server answers a failed request with."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def now() -> str:
    """RFC 3339 in UTC at second precision, as ``creationTimestamp`` is written."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def valid_name(name: str) -> bool:
    """DNS-1123 subdomain (pods, PVCs, network policies all use it)."""
    return len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.match(name))


def generate_name(prefix: str) -> str:
    """``metadata.generateName`` + five random characters, as the API server completes it."""
    return prefix + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))


# -- label selectors ---------------------------------------------------------------------------
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on the commas that are not inside ``(...)`` (set-based values)."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def selector_matches(selector: str | None, labels: dict[str, str] | None) -> bool:
    """``labelSelector``: ``a=b``, ``a==b``, ``a!=b``, ``key``, ``!key``, ``key in (x,y)``,
    ``key notin (x,y)``, ANDed by commas. Raises ValueError on a term it cannot parse (the real
    server answers 400 then)."""
    labels = labels or {}
    for term in _split_terms(selector or ""):
        m = _SET_TERM.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            inside = key in labels and labels[key] in values
            if (op == "in") != inside:
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif re.match(r"^[A-Za-z0-9./_-]+$", term):
            if term not in labels:
                return False
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return True


FIELDS = {"metadata.name", "metadata.namespace"}
POD_FIELDS = FIELDS | {"status.phase"}


def field_selector_matches(selector: str | None, obj: dict[str, Any], fields: set[str]) -> bool:
    """``fieldSelector``: ``f=v``, ``f==v``, ``f!=v`` over ``fields`` (the fake's subset of what the
    API server indexes); another field raises ValueError (400 ``field label not supported``)."""
    for term in _split_terms(selector or ""):
        negate = "!=" in term
        path, value = (p.strip() for p in term.replace("!=", "=").replace("==", "=").split("=", 1))
        if path not in fields:
            raise ValueError(f'field label not supported: "{path}"')
        got: Any = obj
        for part in path.split("."):
            got = got.get(part) if isinstance(got, dict) else None
        if (got == value) == negate:
            return False
    return True


def label_selector_matches(selector: dict[str, Any] | None, labels: dict[str, str] | None) -> bool:
    """A ``LabelSelector`` object (a NetworkPolicy's ``podSelector``): ``matchLabels`` and
    ``matchExpressions`` (In, NotIn, Exists, DoesNotExist), ANDed; an empty one selects all."""
    labels, selector = labels or {}, selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(op)
        if ok is None:
            raise ValueError(f"unknown operator {op!r}")
        if not ok:
            return False
    return True


# -- PATCH -------------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, ``null`` deletes, anything else replaces.

    Also used for ``strategic-merge-patch+json``: on the maps the fake's users patch (labels,
    annotations) both dialects agree; strategic merge's keyed list merging is not modelled (lists
    are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_patch(obj: dict[str, Any], content_type: str, body: Any) -> dict[str, Any]:
    """``obj`` patched in the dialect ``content_type`` names; the identity fields stay."""
    try:
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ValueError("a merge patch is a JSON object")
            patched = merge_patch(obj, body)
        elif content_type == "application/json-patch+json":
            patched = json_patch(obj, body)
        else:
            raise ApiError(
                415,
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
            )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise ApiError(422, str(e)) from None
    if not isinstance(patched.get("metadata"), dict):
        raise ApiError(422, "metadata: Required value")
    for key in ("uid", "name", "namespace", "creationTimestamp", "resourceVersion"):
        patched["metadata"][key] = obj["metadata"][key]
    return patched  # type: ignore[no-any-return]


def kubeconfig(server: str, ca_pem: bytes | None, token: str, namespace: str) -> dict[str, Any]:
    """A kubeconfig: one cluster (trusting ``ca_pem``), a token user, a context with the namespace."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    context = {"cluster": "fake", "user": "fake-user", "namespace": namespace}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "fake-user", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": context}],
        "current-context": "fake",
    }


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch, ``add``/``replace``/``remove``/``test`` (enough for metadata maps).
    Raises ValueError on anything it cannot apply (422 from the server)."""
    if not isinstance(ops, list):
        raise ValueError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise ValueError(f"bad operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise ValueError("the fake cannot patch the whole document")
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.get(p)
            if parent is None:
                raise ValueError(f"path {op['path']!r} does not exist")
        last, kind = parts[-1], op.get("op")
        if kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op.get("value"))
                else:
                    parent[idx] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ValueError(f"replace: {op['path']!r} does not exist")
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise ValueError(f"remove: {op['path']!r} does not exist")
        elif kind == "test":
            got = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if got != op.get("value"):
                raise ValueError(f"test failed at {op['path']!r}")
        else:
            raise ValueError(f"unsupported JSON patch op {kind!r}")
    return doc


# -- TLS ---------------------------------------------------------------------------------------
def make_tls(directory: Path) -> tuple[bytes, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost signed by it.

    Returns (CA certificate PEM, server cert path, server key path); the CA goes into the
    kubeconfig's ``certificate-authority-data`` so the client verifies the server as it would a
    real cluster's (no ``insecure-skip-tls-verify``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    end = start + dt.timedelta(days=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return ca.public_bytes(serialization.Encoding.PEM), cert_path, key_path
