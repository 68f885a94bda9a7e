"""Certificates: issuance (:mod:`.issue`), storage in a directory (:mod:`.files`) or a cluster Secret
with the webhook registrations' ``caBundle`` (:mod:`.cluster`), and the served ``SSLContext``,
reloaded when the files change (:mod:`.reload`; the HTTPS server itself is
:mod:`volcano_job_webhook.server.https`)."""

from .files import CertPaths, ensure_certs
from .issue import CertBundle, default_sans, generate_ca, generate_serving_cert, issue_bundle

__all__ = ["CertBundle", "CertPaths", "default_sans", "ensure_certs", "generate_ca", "generate_serving_cert", "issue_bundle"]
