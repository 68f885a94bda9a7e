"""Label selectors in ``kubectl -l`` syntax (Kubernetes' ``labels.Parse``) read into the API's
``LabelSelector``; ``key>1`` and ``key<1``, which have no ``LabelSelector`` form, are refused, as is
anything the API server would refuse."""

from __future__ import annotations

import re
from typing import Any

from .names import label_key, label_value

# Kubernetes' lexer: these characters are operators, everything else up to them or a blank is a word.
_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s!=,()<>]+)")
_SET_OPERATORS = {"in": "In", "notin": "NotIn"}


def _word(tokens: list[str], i: int, what: str) -> str:
    token = tokens[i] if i < len(tokens) else None
    if token is None or token in ("!=", "==", "=", "!", "(", ")", ",", "<", ">"):
        raise ValueError(f"expected {what}, found {'the end' if token is None else repr(token)}")
    return token


def parse_selector(text: str) -> dict[str, Any]:
    """``text`` as a ``LabelSelector`` (``matchLabels`` and/or ``matchExpressions``); an empty
    ``text`` is the empty selector, every label set. Raises ``ValueError`` saying what is wrong."""
    tokens = _TOKEN.findall(text)  # every character but trailing blanks is in a token
    labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "!":
            key = _word(tokens, i + 1, "a label key after '!'")
            expressions.append({"key": key, "operator": "DoesNotExist"})
            i += 2
        else:
            key = _word(tokens, i, "a label key")
            following = tokens[i + 1] if i + 1 < len(tokens) else ","
            if following == ",":
                expressions.append({"key": key, "operator": "Exists"})
                i += 1
            elif following in ("=", "==", "!="):
                value = tokens[i + 2] if i + 2 < len(tokens) and tokens[i + 2] != "," else ""
                if value:
                    _word(tokens, i + 2, f"a value for {key!r}")
                problem = label_value(value)
                if problem:
                    raise ValueError(problem)
                if following == "!=":
                    expressions.append({"key": key, "operator": "NotIn", "values": [value]})
                elif labels.setdefault(key, value) != value:  # a key's second value: both must hold
                    expressions.append({"key": key, "operator": "In", "values": [value]})
                i += 3 if value else 2
            elif following in _SET_OPERATORS:
                values, i = _set(tokens, i + 2, key)
                expressions.append({"key": key, "operator": _SET_OPERATORS[following], "values": values})
            elif following in ("<", ">"):
                raise ValueError(f"{key}{following}...: a LabelSelector has no numeric comparison")
            else:
                raise ValueError(f"after label key {key!r}: expected ',', '=', '==', '!=', 'in' or 'notin', found {following!r}")
        problem = label_key(key)
        if problem:
            raise ValueError(problem)
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"expected ',' between requirements, found {tokens[i]!r}")
            i += 1
            if i == len(tokens):
                raise ValueError("a requirement is missing after the last ','")
    selector: dict[str, Any] = {}
    if labels:
        selector["matchLabels"] = labels
    if expressions:
        selector["matchExpressions"] = expressions
    return selector


def _set(tokens: list[str], i: int, key: str) -> tuple[list[str], int]:
    """The values of ``key in (a, b)`` from the ``(`` at ``i``, and where the tokens go on."""
    if i >= len(tokens) or tokens[i] != "(":
        raise ValueError(f"expected '(' after {key!r} in / notin")
    values: list[str] = []
    i += 1
    while True:
        value = _word(tokens, i, f"a value in the set of {key!r}")
        problem = label_value(value)
        if problem:
            raise ValueError(problem)
        if value not in values:
            values.append(value)
        i += 1
        if i < len(tokens) and tokens[i] == ")":
            return values, i + 1
        if i >= len(tokens) or tokens[i] != ",":
            raise ValueError(f"expected ',' or ')' in the set of {key!r}")
        i += 1
