"""kube-apiserver's admission webhooks for the API-server double (tests/apiserver.py), as its
``MutatingAdmissionWebhook`` and ``ValidatingAdmissionWebhook`` plugins call them
(k8s.io/apiserver/pkg/admission/plugin/webhook): which webhooks match (rules, namespace and object
selectors), the AdmissionReview POSTed to ``clientConfig.url`` over verified HTTPS within
``timeoutSeconds``, and the answer taken as they take it — a refusal or a failed call as the same
Status and client-go words, ``failurePolicy``, JSON patches in turn, warnings. So the product's
answers are judged here as on a real server; tests/test_apiserver_admission.py runs each case on both.

Not done, kube-apiserver is the test for these: ``reinvocationPolicy``, ``matchConditions``,
``matchPolicy`` (the request's own group/version only), ``sideEffects``, audit annotations.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonpatch

from tests.manifests_util import selector_matches

Obj = dict[str, Any]

REVIEW_VERSIONS = ("v1", "v1beta1")
DEFAULT_TIMEOUT = 10
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Who the double says made every request: it has no authentication, so everyone is an administrator.
USER_INFO: Obj = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}


class Rejected(Exception):
    """The request is refused; ``status`` is the ``Status`` object the API server answers with."""

    def __init__(self, status: Obj) -> None:
        super().__init__(status.get("message", ""))
        self.status = status


@dataclass(frozen=True)
class Attributes:
    """One request as admission sees it (``admission.Attributes``)."""

    operation: str  # CREATE, UPDATE, DELETE
    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    namespace: str  # "" for cluster-scoped objects
    name: str  # "" for a CREATE whose name the server generates later
    obj: Obj | None
    old: Obj | None
    subresource: str = ""
    dry_run: bool = False
    options: Obj | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Call:
    """One webhook call, as the double made it (for tests to read): who, on what, and how it ended
    (``allowed`` True/False, or ``error`` when the call itself failed)."""

    webhook: str
    operation: str
    resource: str
    name: str
    allowed: bool | None = None
    error: str | None = None
    patched: bool = False


# Matching ----------------------------------------------------------------------------------------


def _listed(values: Iterable[str] | None, value: str) -> bool:
    values = list(values or [])
    return "*" in values or value in values


def rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """One ``RuleWithOperations``, as ``webhook/predicates/rules.Matcher`` matches it."""
    if not (_listed(rule.get("operations"), attrs.operation) and _listed(rule.get("apiGroups"), attrs.group)
            and _listed(rule.get("apiVersions"), attrs.version)):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and attrs.namespaced) or (scope == "Namespaced" and not attrs.namespaced):
        return False
    for pattern in rule.get("resources") or []:
        resource, _, sub = pattern.partition("/")
        if resource in ("*", attrs.resource) and sub in ("*", attrs.subresource):
            return True
    return False


def _labels(obj: Obj | None) -> Mapping[str, str] | None:
    return None if obj is None else ((obj.get("metadata") or {}).get("labels") or {})


def hook_matches(hook: Mapping[str, Any], attrs: Attributes) -> bool:
    """Whether ``hook`` is called for this request: rules, then namespaceSelector, then objectSelector."""
    if not any(rule_matches(rule, attrs) for rule in hook.get("rules") or []):
        return False
    if attrs.namespace:
        ns_labels = {**attrs.namespace_labels, NAMESPACE_NAME_LABEL: attrs.namespace}
        if not selector_matches(hook.get("namespaceSelector"), ns_labels):
            return False
    selector = hook.get("objectSelector")
    if not selector:
        return True
    return any(labels is not None and selector_matches(selector, labels) for labels in (_labels(attrs.obj), _labels(attrs.old)))


def webhooks(configurations: Iterable[Obj]) -> list[Obj]:
    """Every webhook of ``configurations``, configurations sorted by name, webhooks in order."""
    out = []
    for config in sorted(configurations, key=lambda c: (c.get("metadata") or {}).get("name") or ""):
        out.extend(h for h in config.get("webhooks") or [] if isinstance(h, dict))
    return out


# Errors, as kube-apiserver builds them -----------------------------------------------------------


class CallFailed(Exception):
    """``webhookutil.ErrCallingWebhook``: the webhook could not be asked, or answered nonsense."""

    def __init__(self, webhook: str, reason: str) -> None:
        super().__init__(f"failed calling webhook {json.dumps(webhook)}: {reason}")
        self.webhook, self.reason = webhook, reason


def internal_error(message: str) -> Rejected:
    """``apierrors.NewInternalError``: 500, the cause repeated in ``details.causes``."""
    return Rejected({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": f"Internal error occurred: {message}", "reason": "InternalError",
                     "details": {"causes": [{"message": message}]}, "code": 500})


def denial(webhook: str, result: Mapping[str, Any] | None) -> Rejected:
    """``webhook/errors.ToStatusErr``: the webhook's status, its code raised to at least 400."""
    status: Obj = copy.deepcopy(dict(result or {}))
    code = status.get("code")
    if not isinstance(code, int) or code < 400:
        status["code"] = 400
    if status.get("status") in (None, "", "Success"):
        status["status"] = "Failure"
    denied_by = f"admission webhook {json.dumps(webhook)} denied the request"
    if status.get("message"):
        status["message"] = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        status["message"] = f"{denied_by}: {status['reason']}"
    else:
        status["message"] = f"{denied_by} without explanation"
    return Rejected({"kind": "Status", "apiVersion": "v1", "metadata": {}, **status})


# Calling one webhook -----------------------------------------------------------------------------


def _review(hook: Mapping[str, Any], attrs: Attributes, obj: Obj | None, version: str) -> Obj:
    kind = {"group": attrs.group, "version": attrs.version, "kind": attrs.kind}
    resource = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    request: Obj = {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": attrs.name,
        "operation": attrs.operation,
        "userInfo": USER_INFO,
        "object": obj,
        "oldObject": attrs.old,
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    }
    if attrs.namespace:
        request["namespace"] = attrs.namespace
    if attrs.subresource:
        request["subResource"] = request["requestSubResource"] = attrs.subresource
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview", "request": request}


def _describe(exc: BaseException, host: str, port: int) -> str:
    """What Go's HTTP client says for the same failure (the words tests and people grep for)."""
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {host}:{port}: connect: connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "context deadline exceeded"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"tls: failed to verify certificate: x509: {exc.verify_message}"
    return str(exc) or type(exc).__name__


def call_webhook(hook: Mapping[str, Any], attrs: Attributes, obj: Obj | None) -> Obj:
    """POST the AdmissionReview and return its ``response``; raises :class:`CallFailed`."""
    name = str(hook.get("name") or "")
    accepted = [v for v in hook.get("admissionReviewVersions") or [] if v in REVIEW_VERSIONS]
    if not accepted:
        raise CallFailed(name, f"webhook does not accept known AdmissionReview versions {list(REVIEW_VERSIONS)}")
    version = accepted[0]
    timeout = hook.get("timeoutSeconds") or DEFAULT_TIMEOUT
    config = hook.get("clientConfig") or {}
    url = config.get("url")
    if not url:
        service = config.get("service") or {}
        target = (f"https://{service.get('name')}.{service.get('namespace')}.svc:{service.get('port', 443)}"
                  f"{service.get('path') or ''}?timeout={timeout}s")
        raise CallFailed(name, f'failed to call webhook: Post "{target}": the API-server double routes to no Service; '
                               "register the webhook with clientConfig.url")
    parts = urlsplit(url)
    query = f"{parts.query}&timeout={timeout}s" if parts.query else f"timeout={timeout}s"
    shown = f"{parts.scheme}://{parts.netloc}{parts.path}?{query}"
    if parts.scheme != "https" or not parts.hostname:
        raise CallFailed(name, f'failed to call webhook: Post "{shown}": the URL must be https://host[:port]/path')
    try:
        bundle = base64.b64decode(config["caBundle"]).decode() if config.get("caBundle") else None
        context = ssl.create_default_context(cadata=bundle)
    except (ValueError, ssl.SSLError) as exc:
        raise CallFailed(name, f"could not get REST client: unable to load root certificates: {exc}") from None
    review = _review(hook, attrs, obj, version)
    body = json.dumps(review).encode()
    port = parts.port or 443
    connection = http.client.HTTPSConnection(parts.hostname, port, context=context, timeout=float(timeout))
    try:
        connection.request("POST", f"{parts.path or '/'}?{query}", body,
                           {"Content-Type": "application/json", "Accept": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
    except (OSError, http.client.HTTPException) as exc:
        raise CallFailed(name, f'failed to call webhook: Post "{shown}": {_describe(exc, parts.hostname, port)}') from None
    finally:
        connection.close()
    if answer.status != 200:
        # client-go shows the body of a text answer, and of any other (JSON that is no Status) nothing
        text = data.decode(errors="replace")[:500] if answer.getheader("Content-Type", "").startswith("text/plain") else "unknown"
        raise CallFailed(name, f'failed to call webhook: an error on the server ("{text}") has prevented the request from succeeding')
    try:
        decoded = json.loads(data)
    except ValueError as exc:
        raise CallFailed(name, f"failed to call webhook: couldn't get version/kind; json parse error: {exc}") from None
    expected = f"admission.k8s.io/{version}"
    if not isinstance(decoded, dict) or decoded.get("apiVersion") != expected or decoded.get("kind") != "AdmissionReview":
        got = f"{decoded.get('apiVersion')}, Kind={decoded.get('kind')}" if isinstance(decoded, dict) else type(decoded).__name__
        raise CallFailed(name, f"received invalid webhook response: expected webhook response of {expected}, "
                               f"Kind=AdmissionReview, got {got}")
    response = decoded.get("response")
    if not isinstance(response, dict):
        raise CallFailed(name, "received invalid webhook response: webhook response was absent")
    if response.get("uid") != review["request"]["uid"]:
        raise CallFailed(name, f"received invalid webhook response: expected response.uid={json.dumps(review['request']['uid'])}, "
                               f"got {json.dumps(response.get('uid'))}")
    if response.get("patch") and not response.get("patchType"):
        raise CallFailed(name, "received invalid webhook response: webhook returned response.patch but not response.patchType")
    return response


# The two plugins ---------------------------------------------------------------------------------


@dataclass
class Admission:
    """What one request went through: the calls made and the warnings gathered."""

    calls: list[Call] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def _ask(self, hook: Mapping[str, Any], attrs: Attributes, obj: Obj | None) -> Obj | None:
        """One call; None when it failed and the failure policy ignores that. Raises :class:`Rejected`."""
        name = str(hook.get("name") or "")
        record = Call(name, attrs.operation, attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else ""),
                      attrs.name)
        self.calls.append(record)
        try:
            response = call_webhook(hook, attrs, obj)
        except CallFailed as exc:
            record.error = str(exc)
            if (hook.get("failurePolicy") or "Fail") == "Ignore":
                return None
            raise internal_error(str(exc)) from None
        self.warnings.extend(str(w) for w in response.get("warnings") or [])
        record.allowed = bool(response.get("allowed"))
        if not record.allowed:
            raise denial(name, response.get("status"))
        return response

    def mutate(self, configurations: Sequence[Obj], attrs: Attributes) -> Obj | None:
        """Run the mutating webhooks; the object as they left it. Raises :class:`Rejected`."""
        obj = copy.deepcopy(attrs.obj)
        for hook in webhooks(configurations):
            current = Attributes(**{**attrs.__dict__, "obj": obj})
            if hook_matches(hook, current):
                obj = self._mutate_once(hook, current, obj)
        return obj

    def _mutate_once(self, hook: Mapping[str, Any], attrs: Attributes, obj: Obj | None) -> Obj | None:
        response = self._ask(hook, attrs, obj)
        if response is None or not response.get("patch") or obj is None:
            return obj
        name = str(hook.get("name") or "")
        if response.get("patchType") != "JSONPatch":
            exc = CallFailed(name, f"unsupported patch type {json.dumps(response.get('patchType'))}")
            self.calls[-1].error = str(exc)
            if (hook.get("failurePolicy") or "Fail") == "Ignore":
                return obj
            raise internal_error(str(exc))
        try:
            operations = json.loads(base64.b64decode(response["patch"]))
            patched = jsonpatch.apply_patch(obj, operations)
        except (ValueError, TypeError, jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise internal_error(f"JSON patch of admission webhook {json.dumps(name)} did not apply: {exc}") from None
        if not isinstance(patched, dict):
            raise internal_error(f"admission webhook {json.dumps(name)} patched the object into a {type(patched).__name__}")
        self.calls[-1].patched = patched != obj
        return patched

    def validate(self, configurations: Sequence[Obj], attrs: Attributes) -> None:
        """Run the validating webhooks (in order; the real server runs them in parallel). Raises
        :class:`Rejected` for the first refusal."""
        for hook in webhooks(configurations):
            if not hook_matches(hook, attrs):
                continue
            response = self._ask(hook, attrs, attrs.obj)
            if response is not None and response.get("patch"):
                name = str(hook.get("name") or "")
                exc = CallFailed(name, "received invalid webhook response: validating webhooks may not return patches")
                self.calls[-1].error = str(exc)
                if (hook.get("failurePolicy") or "Fail") != "Ignore":
                    raise internal_error(str(exc))


def warning_header(text: str) -> str:
    """A ``Warning`` header value as kube-apiserver writes it (``299 - "text"``, with ``"`` and
    ``\\`` escaped). The UTF-8 bytes are carried through latin-1, as HTTP header bytes are."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{escaped}"'.encode().decode("latin-1")
