"""``volcano-webhook``: the command line.

Offline commands run the same plugin chain as the server on files:

* ``mutate --job JOB.yaml POD.yaml`` prints the wired Pod (``--patch``: the JSON patch);
* ``resources --job JOB.yaml`` prints the job's side objects as the reconciler creates them.

Exit status 0 on success, 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from collections.abc import Callable, Sequence

from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.podgen import make_pod

from .admission import API_VERSIONS, admission_review
from .config import load_settings
from .documents import DocumentError, dump_yaml_stream, load_object
from .patch import make_patch

EXIT_BAD_INPUT = 2


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit status 2."""


def _job(source: str) -> Job:
    return Job.from_object(load_object(source, "Job"))


def cmd_mutate(args: argparse.Namespace, chain: Chain) -> int:
    job = _job(args.job)
    if args.pod is not None:
        pod = load_object(args.pod, "Pod")
    elif args.task is not None:
        pod = make_pod(job, args.task, args.index)
    else:
        raise CommandError("give a POD file, or --task (and --index) to build the Pod as Volcano's controller does")
    result = chain.mutate(job, pod)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out = make_patch(pod, result.pod) if args.patch else result.pod
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


def cmd_resources(args: argparse.Namespace, chain: Chain) -> int:
    objects = chain.resources(_job(args.job))
    if args.output == "json":
        print(json.dumps(objects, indent=2, ensure_ascii=False))
    else:
        print(dump_yaml_stream(objects), end="")
    return 0


def cmd_review(args: argparse.Namespace, chain: Chain) -> int:
    job = _job(args.job)
    pod = make_pod(job, args.task, args.index)
    print(json.dumps(admission_review(pod, api_version=args.api_version, uid=args.uid), indent=2, ensure_ascii=False))
    return 0


def cmd_serve(args: argparse.Namespace, chain: Chain) -> int:
    from .serve import serve

    settings = load_settings(
        args.config,
        host=args.host,
        port=args.port,
        certs_dir=args.certs_dir,
        jobs_dir=args.jobs_dir,
        job_source=args.job_source,
        kubeconfig=args.kubeconfig,
        namespaces=args.namespace or None,
        log_level=args.log_level,
        client_ca_file=args.client_ca_file,
    )
    serve(settings)
    return 0


def cmd_certs(args: argparse.Namespace, chain: Chain) -> int:
    from .certs import ensure_certs

    if args.secret is None:
        if args.patch_webhook:
            raise CommandError("--patch-webhook needs --secret NAMESPACE/NAME")
        paths = ensure_certs(args.certs_dir, args.service_name, args.service_namespace)
        print(f"{'created' if paths.created else 'kept'}: {paths.cert}; CA bundle: {paths.ca_cert}")
        return 0
    from .certs_cmd import CertsError, patch_webhooks, sync_secret
    from .kubecache import api_client

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


def cmd_reconcile(args: argparse.Namespace, chain: Chain) -> int:
    from .reconcile_cmd import run

    settings = load_settings(args.config, namespaces=args.namespace or None, log_level=args.log_level, kubeconfig=args.kubeconfig)
    run(
        settings,
        health_port=args.health_port,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        resync_seconds=args.resync_seconds,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="volcano-webhook", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mutate = sub.add_parser("mutate", help="print a Pod as the plugin chain wires it")
    mutate.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    mutate.add_argument("pod", metavar="POD", nargs="?", help="Pod file (YAML or JSON, - for stdin)")
    mutate.add_argument("--task", help="instead of a Pod file: the task whose Pod to build as Volcano's controller does")
    mutate.add_argument("--index", type=int, default=0, help="replica index with --task (default 0)")
    mutate.add_argument("--patch", action="store_true", help="print the RFC 6902 JSON patch instead of the Pod")
    mutate.set_defaults(handler=cmd_mutate)

    resources = sub.add_parser("resources", help="print the side objects a job needs")
    resources.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    resources.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    resources.set_defaults(handler=cmd_resources)

    review = sub.add_parser("review", help="print the AdmissionReview the API server sends for a job's Pod")
    review.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    review.add_argument("--task", required=True, help="task of the Pod")
    review.add_argument("--index", type=int, default=0, help="replica index (default 0)")
    review.add_argument("--api-version", choices=API_VERSIONS, default=API_VERSIONS[0])
    review.add_argument("--uid", default="00000000-0000-4000-8000-000000000000", help="request uid")
    review.set_defaults(handler=cmd_review)

    serve = sub.add_parser("serve", help="run the HTTPS admission webhook")
    serve.add_argument("--config", help="YAML settings file (also VOLCANO_WEBHOOK_CONFIG)")
    serve.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="HTTPS port (default 8443)")
    serve.add_argument("--certs-dir", type=Path, help="ca.crt, tls.crt, tls.key; created when absent (default certs/)")
    serve.add_argument("--client-ca-file", type=Path, help="require client certificates signed by this CA")
    serve.add_argument("--job-source", choices=("files", "kube"), help="where Jobs are looked up (default files)")
    serve.add_argument("--jobs-dir", type=Path, help="Job files for --job-source=files (default examples/jobs)")
    serve.add_argument("--kubeconfig", type=Path, help="kubeconfig for --job-source=kube (default in-cluster)")
    serve.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    serve.set_defaults(handler=cmd_serve)

    certs = sub.add_parser("certs", help="make the CA and serving certificate (locally, or in a Secret)")
    certs.add_argument("--certs-dir", type=Path, default=Path("certs"), help="local directory (default certs/)")
    certs.add_argument("--service-name", default="volcano-job-webhook", help="Service named in the certificate")
    certs.add_argument("--service-namespace", default="volcano-job-webhook", help="its namespace")
    certs.add_argument("--secret", metavar="NAMESPACE/NAME", help="keep the certificate in this kubernetes.io/tls Secret")
    certs.add_argument("--patch-webhook", metavar="NAME", help="set the CA as caBundle of the webhook configurations NAME")
    certs.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    certs.set_defaults(handler=cmd_certs)

    rec = sub.add_parser("reconcile", help="create, update and clean up each job's side objects")
    rec.add_argument("--config", help="YAML settings file (also VOLCANO_WEBHOOK_CONFIG)")
    rec.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    rec.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    rec.add_argument("--health-port", type=int, default=8081, help="plain-HTTP /healthz, /readyz, /metrics (default 8081)")
    rec.add_argument("--leader-elect", action="store_true", help="only the holder of a Lease writes")
    rec.add_argument("--lease-name", default="volcano-job-webhook-reconciler")
    rec.add_argument("--lease-namespace", help="default: $POD_NAMESPACE")
    rec.add_argument("--resync-seconds", type=float, default=300.0, help="how often every job is reconciled anyway")
    rec.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    rec.set_defaults(handler=cmd_reconcile)
    return parser


Handler = Callable[[argparse.Namespace, Chain], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args, Chain())
    except (PluginError, DocumentError, CommandError, ValidationError) as exc:
        if isinstance(exc, ValidationError):
            exc = CommandError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        print(f"volcano-webhook {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ApiException as exc:
        print(f"volcano-webhook {args.command}: the API server answered {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
