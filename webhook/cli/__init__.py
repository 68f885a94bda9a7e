"""``volcano-webhook``: the command line, one module per command, each with ``add_parser(subparsers)``
and ``run(args) -> int``. Exit status 0 on success, 2 with a one-line message on bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubernetes.client.rest import ApiException
from kubernetes.config import ConfigException
from pydantic import ValidationError

from volcano_job_webhook import __version__
from volcano_job_webhook.config import ConfigError
from volcano_job_webhook.documents import DocumentError
from volcano_job_webhook.plugins import PluginError

from . import certs, mutate, reconcile, resources, review, serve
from .inputs import EXIT_BAD_INPUT, CommandError

__all__ = ["EXIT_BAD_INPUT", "CommandError", "build_parser", "main"]

COMMANDS = (mutate, resources, review, serve, certs, reconcile)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="volcano-webhook", description="Volcano's job plugins as an admission webhook")
    parser.add_argument("--version", action="version", version=f"volcano-webhook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    # ConfigException: no cluster to talk to (api_client says what it tried), a setting that cannot work.
    except (PluginError, DocumentError, CommandError, ConfigError, ConfigException, ValidationError) as exc:
        if isinstance(exc, ValidationError):
            exc = CommandError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
        print(f"volcano-webhook {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ApiException as exc:
        print(f"volcano-webhook {args.command}: the API server answered {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    except (MemoryError, RecursionError) as exc:
        # Inputs are bounded before they are built; one still too big is one line too, never a traceback.
        print(f"volcano-webhook {args.command}: input too large or too deeply nested to process ({type(exc).__name__})",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (| head): nothing left to say
        sys.stderr.close()
        return 1
    except KeyboardInterrupt:
        return 130
