"""Certificates: issuance (:mod:`.issue`), storage in a directory (:mod:`.files`) or a cluster Secret
with the webhook registrations' ``caBundle`` (:mod:`.cluster`), and TLS serving with reloads
(:mod:`.tls`)."""

from .files import CertPaths, ensure_certs
from .issue import CertBundle, default_sans, generate_ca, generate_serving_cert, issue_bundle

__all__ = ["CertBundle", "CertPaths", "default_sans", "ensure_certs", "generate_ca", "generate_serving_cert", "issue_bundle"]
