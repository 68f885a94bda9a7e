"""Reading Kubernetes objects from YAML or JSON files, or standard input (``-``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from volcano_job_webhook.plugins import Job


class _JsonLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it: ``2024-01-01T00:00:00Z`` stays a string (Kubernetes objects are
    JSON, and a parsed ``datetime`` would compare unequal to the string the API server sends)."""


_JsonLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class DocumentError(ValueError):
    """A file that cannot be read or does not hold the object expected."""


def read_text(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"{source}: cannot read: {exc}") from None


def parse_documents(text: str, source: str = "<input>") -> list[Any]:
    """Every non-empty document of a YAML stream (JSON is YAML too)."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_JsonLoader) if doc is not None]
    except yaml.YAMLError as exc:
        reason = str(exc).replace("\n", " ")
        raise DocumentError(f"{source}: not valid YAML or JSON: {reason}") from None


def load_object(source: str, kind: str) -> dict[str, Any]:
    """The one object of ``kind`` in ``source``. A stream with several objects must hold exactly
    one of that kind; an object without ``kind`` is taken as it is."""
    docs = parse_documents(read_text(source), source)
    if not docs:
        raise DocumentError(f"{source}: no document found")
    if any(not isinstance(doc, dict) for doc in docs):
        raise DocumentError(f"{source}: expected a {kind} object, found something else")
    if len(docs) == 1 and docs[0].get("kind") in (None, kind):
        return docs[0]
    matches = [doc for doc in docs if doc.get("kind") == kind]
    if len(matches) != 1:
        found = ", ".join(str(doc.get("kind")) for doc in docs)
        raise DocumentError(f"{source}: expected one {kind}, found: {found}")
    return matches[0]


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (host files, ssh config) as ``|`` blocks, readable as files."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def dump_yaml_stream(objects: list[Any]) -> str:
    """A ``---``-separated YAML stream, keys in their given order."""
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, explicit_start=True, allow_unicode=True)


def load_job(source: str) -> Job:
    """The Volcano Job in a file (``-`` for standard input)."""
    return Job.from_object(load_object(source, "Job"))
