"""Go ``flag`` package syntax, parsed strictly: what Volcano's ``flag.FlagSet`` accepts, but every failure
it only logs is an error here (docs/volcano-behaviour.md#arguments). A ``list`` flag (ours only) is Go's
``flag.Var`` that appends: one value per occurrence, which may hold commas."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import FlagError, did_you_mean

Kind = Literal["string", "int", "bool", "list"]

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# Go's strconv.ParseInt(s, 0, 64) literal syntax: optional sign, then a prefixed or plain number;
# underscores only between digits, as Go allows them when the base comes from the literal.
_GO_INT = re.compile(
    r"""^[+-]?(?:
        0[xX](?:_?[0-9a-fA-F])+ |
        0[bB](?:_?[01])+ |
        0[oO](?:_?[0-7])+ |
        0(?:_?[0-7])* |
        [1-9](?:_?[0-9])*
    )$""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Flag:
    """One flag of a plugin: its Go name, type, default, other spellings and integer range. ``ours``: a
    flag only our implementation of one of Volcano's plugins has, left out where Volcano's controller
    runs it (:func:`volcano_flags`). A ``list`` flag's value is a tuple of every occurrence's text."""

    name: str
    kind: Kind
    default: Any
    help: str = ""
    aliases: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    ours: bool = False


def volcano_flags(flags: Sequence[Flag]) -> tuple[Flag, ...]:
    """The flags Volcano's own implementation of a plugin defines: ``flags`` without ours."""
    return tuple(flag for flag in flags if not flag.ours)


def shown(token: object, limit: int = 24) -> str:
    """A token as error messages may show it: short, so that a key pasted into the wrong list
    element never ends up in a message, a log or an admission response."""
    text = token if isinstance(token, str) else repr(token)
    return repr(text) if len(text) <= limit else repr(text[: limit - 8] + "…") + f" ({len(text)} characters)"


def port_flag(name: str, default: int, help: str = "", aliases: tuple[str, ...] = ()) -> Flag:
    """An integer flag that must be a TCP port number."""
    return Flag(name, "int", default, help, aliases, minimum=1, maximum=65535)


def parse_go_int(text: str) -> int:
    """Parse an integer as Go's ``strconv.ParseInt(text, 0, 64)`` would, or raise ``ValueError``."""
    if not _GO_INT.match(text):
        raise ValueError(f"invalid syntax {text!r}")
    sign = -1 if text[0] == "-" else 1
    body = text.lstrip("+-").replace("_", "")
    if len(body) > 1 and body[0] == "0" and body[1] not in "xXbBoO":
        value = int(body[1:], 8)
    else:
        value = int(body, 0)
    value *= sign
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"value out of range {text!r}")
    return value


def parse_go_bool(text: str) -> bool:
    """Parse a boolean as Go's ``strconv.ParseBool`` would, or raise ``ValueError``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r} (use true or false)")


def _convert(flag: Flag, text: str) -> Any:
    if flag.kind in ("string", "list"):
        return text
    if flag.kind == "bool":
        return parse_go_bool(text)
    value = parse_go_int(text)
    if (flag.minimum is not None and value < flag.minimum) or (flag.maximum is not None and value > flag.maximum):
        raise ValueError(f"{value} is outside {flag.minimum}..{flag.maximum}")
    return value


def parse_flags(flags: Sequence[Flag], args: Sequence[str]) -> dict[str, Any]:
    """Every flag's value by its canonical name, defaults included, from ``args`` (one token per list
    element); :class:`FlagError` for anything Go's ``flag`` would reject or silently drop."""
    values, _, error = _parse(flags, args)
    if error is not None:
        raise error
    return values


def go_prefix(flags: Sequence[Flag], args: Sequence[str]) -> tuple[list[str], FlagError | None]:
    """What Go's ``flag.Parse`` keeps of ``args``, which Volcano's controller runs the plugin with: the
    flags before the first error, and that error (None when everything parses)."""
    _, consumed, error = _parse(flags, args)
    return list(args[:consumed]), error


def _parse(flags: Sequence[Flag], args: Sequence[str]) -> tuple[dict[str, Any], int, FlagError | None]:
    """The values parsed, how many tokens the flags parsed so far took, and the first error."""
    by_name: dict[str, Flag] = {}
    for flag in flags:
        by_name[flag.name] = flag
        for alias in flag.aliases:
            by_name[alias] = flag
    values: dict[str, Any] = {flag.name: flag.default for flag in flags}
    tokens = list(args)
    i = 0

    def fail(flag: str, reason: str) -> tuple[dict[str, Any], int, FlagError]:
        return values, consumed, FlagError(flag, reason)

    while i < len(tokens):
        consumed = i
        token = tokens[i]
        i += 1
        if not isinstance(token, str):
            return fail("", f"argument {shown(token)} is not a string")
        if len(token) < 2 or token[0] != "-":
            return fail(
                f"argument {shown(token)}", "unexpected argument: each list element must be one flag such as --name=value"
            )
        dashes = 2 if token[1] == "-" else 1
        if token == "--":
            if i < len(tokens):
                return fail("--", f"{len(tokens) - i} argument(s) after '--' would be ignored")
            break
        name, eq, value = token[dashes:].partition("=")
        if not name or name[0] in "-=":
            return fail(f"argument {shown(token)}", "bad flag syntax")
        found = by_name.get(name)
        if found is None:
            known = ", ".join(f"--{f.name}" for f in flags) or "none"
            hint = did_you_mean(name, by_name, lambda flag: f"--{flag}")
            return fail(f"--{shown(name)[1:-1]}", f"flag provided but not defined{hint} (known flags: {known})")
        flag = found
        if not eq:
            if flag.kind == "bool":
                values[flag.name] = True
                continue
            if i >= len(tokens):
                return fail(f"--{name}", "flag needs an argument")
            value = tokens[i]
            i += 1
        try:
            converted = _convert(flag, value)
            values[flag.name] = (*values[flag.name], converted) if flag.kind == "list" else converted
        except ValueError as exc:  # a long value is never repeated whole (see shown): the reason calls it "it"
            reason = str(exc).replace(repr(value), "it") if len(value) > 24 else str(exc)
            return fail(f"--{name}", f"invalid value {shown(value)}: {reason}")
    return values, len(tokens), None
