"""volcano-job-webhook: Volcano's job plugins as an admission webhook, a reconciler and a CLI.

One subpackage per process, importing one way (``cli`` over the others, every one over ``plugins``):

* :mod:`.plugins` — the plugin contract, the built-in plugins and the chain (pure: no I/O);
* :mod:`.server` — the admission webhook: AdmissionReview in, JSON patch out, job sources;
* :mod:`.reconciler` — the controller that keeps each job's side objects, with leader election;
* :mod:`.kube` — Kubernetes access shared by both: client, backoff, the Job informer;
* :mod:`.certs` — the CA and serving certificate, on disk or in a Secret, and TLS serving;
* :mod:`.cli` — ``volcano-webhook``, the commands over all of them.

Importing this package imports nothing else, so ``volcano_job_webhook.plugins`` stays light.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
