"""The admission webhook: AdmissionReview in, JSON patch out.

A request flows one way: :mod:`.review` parses it, a :mod:`.handlers` handler checks the object's
shape (:mod:`.shape`), looks the job up in a job source (:mod:`.jobs`), runs the plugin chain and
diffs the Pod (:mod:`.patch`); :mod:`.app` serves it over HTTP with :mod:`.metrics`; :mod:`.run`
starts the whole process: the HTTPS-only uvicorn server of :mod:`.https`, accepting connections
under the limits of :mod:`.listener` and :mod:`.connections` and handing memory back with
:mod:`.memory`.
"""

from .app import AdmissionEndpoint, WebhookServer, create_app
from .handlers import Handler, JobCache, JobValidator, PodMutator
from .jobs import DirectoryJobSource, JobSource
from .patch import make_patch
from .review import AdmissionRequest, AdmissionResponse, ReviewError, admission_review, parse_review, review_response

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
