"""``volcano-webhook certs``: make the serving certificate, locally or in a cluster Secret.

Locally it fills a certs directory (as ``serve`` does on start). With ``--secret NS/NAME`` it keeps
a ``kubernetes.io/tls`` Secret and with ``--patch-webhook NAME`` sets its CA as the ``caBundle`` of
the webhook configurations called NAME; nothing is written when nothing changes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .errors import CommandError


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("certs", help="make the CA and serving certificate (locally, or in a Secret)")
    parser.add_argument("--certs-dir", type=Path, default=Path("certs"), help="local directory (default ./certs)")
    parser.add_argument("--service-name", default="volcano-job-webhook", help="Service named in the certificate")
    parser.add_argument("--service-namespace", default="volcano-job-webhook", help="its namespace")
    parser.add_argument("--secret", metavar="NAMESPACE/NAME", help="keep the certificate in this kubernetes.io/tls Secret")
    parser.add_argument("--patch-webhook", metavar="NAME", help="set the CA as caBundle of the webhook configurations NAME")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.secret is None:
        from volcano_job_webhook.certs.files import ensure_certs

        if args.patch_webhook:
            raise CommandError("--patch-webhook needs --secret NAMESPACE/NAME")
        paths = ensure_certs(args.certs_dir, args.service_name, args.service_namespace)
        print(f"{'created' if paths.created else 'kept'}: {paths.cert}; CA bundle: {paths.ca_cert}")
        return 0
    from volcano_job_webhook.certs.cluster import CertsError, patch_webhooks, sync_secret
    from volcano_job_webhook.kube.client import api_client

    namespace, sep, name = args.secret.partition("/")
    if not sep or not namespace or not name:
        raise CommandError(f"--secret must be NAMESPACE/NAME, got {args.secret!r}")
    api = api_client(args.kubeconfig)
    bundle, written = sync_secret(api, namespace, name, args.service_name, args.service_namespace)
    print(f"Secret {namespace}/{name}: {'written' if written else 'unchanged'}")
    if args.patch_webhook:
        try:
            patched = patch_webhooks(api, args.patch_webhook, bundle.ca_cert)
        except CertsError as exc:
            raise CommandError(str(exc)) from None
        print(f"caBundle of {args.patch_webhook}: {', '.join(patched) + ' patched' if patched else 'unchanged'}")
    return 0
