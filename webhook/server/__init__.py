"""The admission webhook: AdmissionReview in, JSON patch out.

A request flows one way: :mod:`.review` parses it, a :mod:`.handlers` handler checks the object's
shape (:mod:`.shape`), looks the job up in a job source (:mod:`.jobs`), runs the plugin chain and
diffs the Pod (:mod:`.patch`); :mod:`.app` serves it over HTTP with :mod:`.metrics`; :mod:`.run`
starts the whole process: the HTTPS-only uvicorn server of :mod:`.https`, accepting connections
under the limits of :mod:`.connections` and handing memory back with :mod:`.memory`.
"""

from importlib import import_module
from typing import Any

# Re-exported lazily (PEP 562), so that the offline commands, which use only .patch and .review,
# do not load FastAPI, uvicorn and the server's modules.
_EXPORTS = {
    "AdmissionEndpoint": ".app", "WebhookServer": ".app", "create_app": ".app",
    "Handler": ".handlers", "JobCache": ".handlers", "JobValidator": ".handlers", "PodMutator": ".handlers",
    "DirectoryJobSource": ".jobs", "JobSource": ".jobs",
    "make_patch": ".patch",
    "AdmissionRequest": ".review", "AdmissionResponse": ".review", "ReviewError": ".review",
    "admission_review": ".review", "parse_review": ".review", "review_response": ".review",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


__all__ = [
    "AdmissionEndpoint",
    "AdmissionRequest",
    "AdmissionResponse",
    "DirectoryJobSource",
    "Handler",
    "JobCache",
    "JobSource",
    "JobValidator",
    "PodMutator",
    "ReviewError",
    "WebhookServer",
    "admission_review",
    "create_app",
    "make_patch",
    "parse_review",
    "review_response",
]
