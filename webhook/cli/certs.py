"""``volcano-webhook certs``: make and renew the serving certificate, in a certs directory (as ``serve``
does on start) or, with ``--secret NS/NAME``, in the serving Secret beside the CA's own (``--ca-secret``,
never mounted by the webhook), and with ``--patch-webhook`` as the webhook configurations' ``caBundle``.
Only what is due is written (:mod:`volcano_job_webhook.certs.rotation`): it is meant to run on a schedule.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .inputs import CommandError

DEFAULT_CA_SECRET = "volcano-job-webhook-ca"


def _window(text: str) -> Any:
    from volcano_job_webhook.certs.issue import RenewBefore

    try:
        return RenewBefore.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("certs", help="make or renew the CA and serving certificate (locally, or in Secrets)")
    parser.add_argument("--certs-dir", type=Path, default=Path("certs"), help="local directory (default ./certs)")
    parser.add_argument("--service-name", default="volcano-job-webhook", help="Service named in the certificate")
    parser.add_argument("--service-namespace", default="volcano-job-webhook", help="its namespace")
    parser.add_argument("--secret", metavar="NAMESPACE/NAME", help="keep the serving certificate in this kubernetes.io/tls Secret")
    parser.add_argument("--ca-secret", metavar="NAME", default=DEFAULT_CA_SECRET,
                        help=f"with --secret: the Secret of the CA's key, in the same namespace (default {DEFAULT_CA_SECRET})")
    parser.add_argument("--patch-webhook", metavar="NAME", help="set the CA bundle as caBundle of the webhook configurations NAME")
    parser.add_argument("--renew-before", type=_window, default=None, metavar="WINDOW",
                        help="renew the serving certificate this long before it expires: a share of its lifetime "
                             "(33%%) or a time (30d, 720h); default 33%%, the last third of its life")
    parser.add_argument("--ca-renew-before", type=_window, default=None, metavar="WINDOW",
                        help="start rotating the CA this long before it expires (same forms; default 33%%)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from volcano_job_webhook.certs.issue import Policy

    windows = {"renew_before": args.renew_before, "ca_renew_before": args.ca_renew_before}
    policy = Policy(**{name: window for name, window in windows.items() if window is not None})
    if args.secret is None:
        from volcano_job_webhook.certs.files import ensure_certs

        if args.patch_webhook:
            raise CommandError("--patch-webhook needs --secret NAMESPACE/NAME")
        paths = ensure_certs(args.certs_dir, args.service_name, args.service_namespace, policy=policy)
        print(f"{'created' if paths.created else 'kept'}: {paths.cert}; CA bundle: {paths.ca_cert}")
        return 0
    from volcano_job_webhook.certs.cluster import CertsError, sync
    from volcano_job_webhook.kube.rest import api_client

    namespace, sep, name = args.secret.partition("/")
    if not sep or not namespace or not name:
        raise CommandError(f"--secret must be NAMESPACE/NAME, got {args.secret!r}")
    if "/" in args.ca_secret:
        raise CommandError(f"--ca-secret is a name in the namespace of --secret ({namespace}), got {args.ca_secret!r}")
    api = api_client(args.kubeconfig)
    try:
        result = sync(api, namespace, name, args.ca_secret, args.service_name, args.service_namespace,
                      webhook=args.patch_webhook, policy=policy)
    except CertsError as exc:
        raise CommandError(str(exc)) from None
    for change in result.outcome.changes:
        print(change)
    print(f"Secret {namespace}/{name}: {'written' if result.serving_written else 'unchanged'}")
    print(f"Secret {namespace}/{args.ca_secret}: {'written' if result.ca_written else 'unchanged'}")
    if args.patch_webhook:
        print(f"caBundle of {args.patch_webhook}: {', '.join(result.patched) + ' patched' if result.patched else 'unchanged'}")
    return 0
