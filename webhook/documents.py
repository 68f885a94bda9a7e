"""Kubernetes objects from YAML or JSON files or standard input (``-``), within bounds, as whoever writes
the file may be hostile (:mod:`.limits`); each refusal is one :class:`DocumentError` line."""

from __future__ import annotations

import os
import select
import stat
import sys
from typing import Any

import yaml

from volcano_job_webhook.limits import MAX_ALIAS_NODES, MAX_DEPTH, MAX_INPUT_BYTES

# Standard input that sends nothing for this long is taken as never ending.
STDIN_IDLE_SECONDS = 30.0


class DocumentError(ValueError):
    """A file that cannot be read or does not hold the object expected."""


class _Refused(yaml.YAMLError):
    pass


class _JsonLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it (a timestamp stays a string, as the API server sends it), composing
    (PyYAML's only recursion) at most :data:`MAX_DEPTH` levels deep, and a document with aliases
    measured as it would be once expanded before anything is built from it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            return super().compose_node(parent, index)
        if self.check_event(yaml.ScalarEvent):  # depth counts lists and maps, as JSON nesting does
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        self._aliases = 0
        node = super().compose_document()
        if self._aliases:
            added = _added_by_aliases(node)
            if added == float("inf"):
                raise _Refused("a YAML alias refers to a node that contains it")
            if added > MAX_ALIAS_NODES:
                raise _Refused(f"YAML aliases would add more than {MAX_ALIAS_NODES} nodes (an alias bomb?)")
        return node


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _added_by_aliases(root: Any) -> float:
    """Nodes ``root``'s aliases add once expanded; ``inf`` for a node that contains itself."""
    sizes: dict[int, float] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        if key in sizes:
            continue
        if key in on_path:
            return float("inf")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)] - len(sizes)  # every distinct node is in sizes once


_JsonLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _over(source: str, limit: int) -> DocumentError:
    return DocumentError(f"{source}: larger than the limit of {limit} bytes")


def read_file(path: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, opened without blocking (a FIFO would
    hang ``open``) and checked on the open descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise DocumentError(f"{path}: not a regular file")
            if info.st_size > limit:
                raise _over(path, limit)
            return _read_all(fd, path, limit)  # over the limit only if it grew while being read
        finally:
            os.close(fd)
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_stdin(limit: int = MAX_INPUT_BYTES, idle: float = STDIN_IDLE_SECONDS) -> bytes:
    """Standard input, up to ``limit`` bytes; refused when it is a terminal or silent for ``idle`` seconds."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream (tests, embedding)
        fd = -1
    if fd < 0:
        text = sys.stdin.read(limit + 1)
        data = text.encode("utf-8") if isinstance(text, str) else text
        if len(data) > limit:
            raise _over("-", limit)
        return data
    if os.isatty(fd):
        raise DocumentError("-: standard input is a terminal; pipe the file in or name it")
    return _read_all(fd, "-", limit, idle)


def _read_all(fd: int, source: str, limit: int, idle: float | None = None) -> bytes:
    """What ``fd`` holds, up to ``limit`` bytes; with ``idle``, refused when nothing comes for that long."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        if idle is not None and not select.select([fd], [], [], idle)[0]:
            raise DocumentError(f"{source}: nothing read from standard input for {idle:g} s")
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise _over(source, limit)


def read_text(source: str, limit: int = MAX_INPUT_BYTES) -> str:
    """``source`` (a path, or ``-`` for standard input) as UTF-8 text, within the bounds above."""
    data = read_stdin(limit) if source == "-" else read_file(source, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{source}: not UTF-8 text (byte {exc.start})") from None


def parse_documents(text: str, source: str = "<input>") -> list[Any]:
    """Every non-empty document of a YAML stream (JSON is YAML too), within the bounds above."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_JsonLoader) if doc is not None]
    except _Refused as exc:
        raise DocumentError(f"{source}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        reason = str(exc).replace("\n", " ")
        raise DocumentError(f"{source}: not valid YAML or JSON: {reason}") from None


def load_object(source: str, kind: str | tuple[str, ...]) -> dict[str, Any]:
    """The one object of ``kind`` (or of one of several) in ``source``. A stream with several
    objects must hold exactly one of that kind; an object without ``kind`` is taken as it is."""
    kinds = (kind,) if isinstance(kind, str) else kind
    kind = " or ".join(kinds)
    docs = parse_documents(read_text(source), source)
    if not docs:
        raise DocumentError(f"{source}: no document found")
    if any(not isinstance(doc, dict) for doc in docs):
        raise DocumentError(f"{source}: expected a {kind} object, found something else")
    if len(docs) == 1 and docs[0].get("kind") in (None, *kinds):
        return docs[0]
    matches = [doc for doc in docs if doc.get("kind") in kinds]
    if len(matches) != 1:
        found = ", ".join(str(doc.get("kind")) for doc in docs)
        raise DocumentError(f"{source}: expected one {kind}, found: {found}")
    return matches[0]


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks, and no ``&id001`` anchors (Kubernetes objects are JSON)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def dump_yaml(value: Any, stream: bool = False) -> str:
    """One YAML document, or with ``stream`` a list of objects as a ``---``-separated stream, keys in their given order."""
    if stream:
        return yaml.dump_all(value, Dumper=_BlockDumper, sort_keys=False, explicit_start=True, allow_unicode=True)
    return yaml.dump(value, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True)
