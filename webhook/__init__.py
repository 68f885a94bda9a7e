"""volcano-job-webhook: Volcano's job plugins as an admission webhook, a reconciler and a CLI
(docs/architecture.md maps its subpackages). Importing it imports nothing else, so
``volcano_job_webhook.plugins`` stays light."""

__version__ = "0.1.0"

__all__ = ["__version__"]
