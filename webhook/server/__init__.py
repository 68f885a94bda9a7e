"""The admission webhook (``volcano-webhook serve``): :mod:`.review` parses an AdmissionReview, a
:mod:`.handlers` handler looks its job up (:mod:`.jobs`), runs the chain and diffs the Pod
(:mod:`.patch`), :mod:`.app` serves it and :mod:`.https` runs the HTTPS server."""

from importlib import import_module
from typing import Any

# Re-exported lazily (PEP 562), so that the offline commands, which use only .patch and .review,
# do not load FastAPI, uvicorn and the server's modules.
_EXPORTS = {
    "create_app": ".app",
    "Handler": ".handlers", "JobCache": ".handlers", "JobValidator": ".handlers", "PodMutator": ".handlers",
    "DirectoryJobSource": ".jobs", "JobSource": ".jobs",
    "make_patch": ".patch",
    "AdmissionRequest": ".review", "AdmissionResponse": ".review", "AdmissionReview": ".review", "ReviewError": ".review",
    "admission_review": ".review", "parse_review": ".review", "read_review": ".review", "review_response": ".review",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


__all__ = sorted(_EXPORTS)
