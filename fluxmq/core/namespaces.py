"""Environments as namespaces of queue names: pure functions, no I/O.

A caller names queues as it sees them (``orders``); the broker stores them under a name scoped
by the caller's environment, so that ``orders`` of development and ``orders`` of production are
two queues, and nothing a development key does can tell whether production has an ``orders``
(there is no shared name to collide with, to squat, or to probe).

The operators' environment (the node's ``default_environment``, production unless configured
otherwise) and every call with authentication off use names as they are: the stored name *is*
the caller's name, as before namespaces existed. Any other environment's queues are stored as
``<environment>:<name>``; ``:`` is not a name character, so no caller's name can collide with a
scoped one.

>>> scope = scope_of("development", "production")
>>> stored = scoped_name(scope, "orders")
>>> stored, caller_name(scope, stored)
('development:orders', 'orders')
>>> scoped_name(scope_of("production", "production"), "orders")
'orders'
>>> scope_of_name("development:orders"), scope_of_name("orders")
('development', '')
"""

from __future__ import annotations

import re

from fluxmq.core.auth import ENVIRONMENTS
from fluxmq.core.errors import invalid_argument
from fluxmq.core.limits import QUEUE_NAME_RE

SCOPE_SEPARATOR = ":"
_SCOPES = "|".join(re.escape(e) for e in ENVIRONMENTS)
# A name as stored: a caller's name, optionally under one environment's scope.
STORED_QUEUE_NAME_RE = re.compile(rf"^(?:(?:{_SCOPES}){SCOPE_SEPARATOR})?[A-Za-z0-9._-]{{1,200}}\Z")
# A prefix of stored names (ListQueues): a scope alone is one.
STORED_PREFIX_RE = re.compile(rf"^(?:(?:{_SCOPES}){SCOPE_SEPARATOR})?[A-Za-z0-9._-]{{0,200}}\Z")
_NAME_CHARS = "A-Za-z0-9._-"
NAME_RULE = "1..200 characters of A-Z a-z 0-9 . _ -"


def scope_of(environment: str, default_environment: str) -> str:
    """The scope of a caller's names: "" for the operators' environment (names as they are)."""
    return "" if environment in ("", default_environment) else environment


def scoped_name(scope: str, name: str) -> str:
    """The stored name of the caller's ``name`` (a caller name, already checked)."""
    return f"{scope}{SCOPE_SEPARATOR}{name}" if scope else name


def scope_of_name(stored: str) -> str:
    """The environment a stored name is scoped by ("" when it is not scoped)."""
    scope, sep, _rest = stored.partition(SCOPE_SEPARATOR)
    return scope if sep and scope in ENVIRONMENTS else ""


def caller_name(scope: str, stored: str) -> str:
    """``stored`` as a caller of ``scope`` names it (unchanged when not in that scope)."""
    if scope and stored.startswith(scope + SCOPE_SEPARATOR):
        return stored[len(scope) + 1 :]
    return stored


def check_caller_name(name: str, field_path: str, scope: str | None) -> str:
    """The stored name of ``name`` given by a caller of ``scope``; INVALID_ARGUMENT naming the
    field for what is not a name.

    ``scope`` None (authentication off) accepts stored names as they are, scoped or not: with
    no keys there are no environments to keep apart. A scoped caller's name may already carry
    its own scope (a call forwarded by another node was scoped there); another scope is not a
    name it can give."""
    if scope is None:
        if STORED_QUEUE_NAME_RE.match(name):
            return name
    elif scope and name.startswith(scope + SCOPE_SEPARATOR):
        if QUEUE_NAME_RE.match(name[len(scope) + 1 :]):
            return name
    elif QUEUE_NAME_RE.match(name):
        return scoped_name(scope, name)
    raise invalid_argument(field_path, f"{name!r} is not a queue name: {NAME_RULE}")


def scoped_prefix(scope: str, prefix: str) -> str:
    """A ListQueues prefix within the caller's scope (the scan stays inside it)."""
    if scope and prefix.startswith(scope + SCOPE_SEPARATOR):
        return prefix
    return f"{scope}{SCOPE_SEPARATOR}{prefix}" if scope else prefix


def caller_text(scope: str, text: str) -> str:
    """``text`` (an error message, a detail) with the caller's own stored names shown as the
    caller names them."""
    if not scope or scope + SCOPE_SEPARATOR not in text:
        return text
    return _scope_pattern(scope).sub("", text)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _scope_pattern(scope: str) -> re.Pattern[str]:
    pattern = _PATTERNS.get(scope)
    if pattern is None:
        # The scope as a name's start: not inside a longer word, and followed by a name.
        pattern = _PATTERNS[scope] = re.compile(
            rf"(?<![{_NAME_CHARS}]){re.escape(scope)}{SCOPE_SEPARATOR}(?=[{_NAME_CHARS}])"
        )
    return pattern
