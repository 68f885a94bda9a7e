"""Certificates: issued (:mod:`.issue`), kept in a directory (:mod:`.files`) or the cluster
(:mod:`.rotation`, :mod:`.cluster`, :mod:`.secret`), and served (:mod:`.reload`)."""

from .files import CertPaths, ensure_certs
from .issue import CertBundle, Policy, default_sans, generate_ca, generate_serving_cert

__all__ = ["CertBundle", "CertPaths", "Policy", "default_sans", "ensure_certs", "generate_ca", "generate_serving_cert"]
