"""``fluxmqctl key create|list|revoke``: the broker's API keys (an admin key is needed);
``key generate``: a fresh key made locally, for a node's ``auth_bootstrap_key``.

A key is shown whole only by ``key create``, once; listings show its prefix
(``fmq_live_sk_<key id>``), never a secret."""

from __future__ import annotations

import argparse
import secrets
import string
import sys
from typing import Any

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.cli.conn import KEY_ID_CHARS, KEY_PREFIXES, Context, UsageError, confirm
from fluxmq.cli.output import message_dict, show_time

ROLES = ("admin", "producer", "consumer", "read-only")
ENVIRONMENTS = ("development", "staging", "production")
SHOWN_ONCE = (
    "warning: this is the only time the key is shown; store it now (e.g. in a secret manager): "
    "it cannot be shown again, only revoked"
)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    noun = sub.add_parser("key", help="create, list, revoke API keys")
    verbs = noun.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser(
        "create",
        parents=[common],
        help="create an API key (printed once)",
        description="Creates an API key and prints it: the only time it is shown.",
    )
    p.add_argument("--name", required=True, help="what the key is for (1-64 of A-Za-z0-9._- )")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--tier", default="", help='rate-limit tier (default "default")')
    p.add_argument(
        "--environment",
        choices=ENVIRONMENTS,
        default="",
        help="(default: the environment of the key making the call)",
    )
    p.set_defaults(handler=create)

    p = verbs.add_parser("list", parents=[common], help="list API keys (never a secret)")
    p.add_argument("--all", action="store_true", help="revoked keys too")
    p.set_defaults(handler=list_keys)

    p = verbs.add_parser("revoke", parents=[common], help="revoke an API key")
    p.add_argument("key_id", metavar="KEY_ID", help="its id (8 characters) or prefix")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(handler=revoke)

    p = verbs.add_parser(
        "generate",
        help="print a new random key (no broker involved): the bootstrap admin key of a cluster",
        description="Prints a new random API key, made on this machine. It means nothing until a "
        "node registers it: give it to the nodes as auth_bootstrap_key (or _file, or "
        "FLUXMQ_AUTH_BOOTSTRAP_KEY) and they register it as the first admin key of its "
        "environment. For every other key use `key create`.",
    )
    p.add_argument("--environment", choices=ENVIRONMENTS, default="production")
    p.set_defaults(handler=generate)


def key_id_of(text: str) -> str:
    """``AbCd1234``, ``fmq_live_sk_AbCd1234`` or ``fmq_live_sk_AbCd1234…`` -> ``AbCd1234``."""
    text = text.strip().rstrip("…")
    for prefix in KEY_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            if len(text) > KEY_ID_CHARS:
                raise UsageError(
                    "KEY_ID: give the key's id or prefix, not the whole key "
                    "(the secret does not belong on a command line)"
                )
            break
    if len(text) != KEY_ID_CHARS or not text.isascii() or not text.isalnum():
        raise UsageError(f"KEY_ID: {KEY_ID_CHARS} letters or digits (see fluxmqctl key list)")
    return text


def _info_fields(info: apb.ApiKeyInfo) -> list[tuple[str, object]]:
    return [
        ("key_id", info.key_id),
        ("prefix", info.prefix),
        ("name", info.name),
        ("environment", info.environment),
        ("role", info.role),
        ("tier", info.tier or "default"),
        ("created", show_time(info.created_ms)),
        ("last used", show_time(info.last_used_ms) if info.last_used_ms else "never"),
        ("revoked", show_time(info.revoked_ms) if info.revoked_ms else "no"),
    ]


def create(args: argparse.Namespace, ctx: Context) -> int:
    request = apb.CreateApiKeyRequest(
        name=args.name, role=args.role, tier=args.tier, environment=args.environment
    )
    resp: apb.CreateApiKeyResponse = ctx.conn.call(ctx.conn.admin.CreateApiKey, request)
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
    else:
        ctx.out.fields([("key", resp.key), *_info_fields(resp.info)])
        ctx.out.flush()
    print(SHOWN_ONCE, file=sys.stderr, flush=True)
    return 0


def list_keys(args: argparse.Namespace, ctx: Context) -> int:
    resp: apb.ListApiKeysResponse = ctx.conn.call(
        ctx.conn.admin.ListApiKeys, apb.ListApiKeysRequest(include_revoked=args.all)
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(resp))
        return 0
    rows = [
        [
            k.prefix,
            k.environment or "-",
            k.role or "-",
            k.tier or "default",
            show_time(k.created_ms),
            show_time(k.last_used_ms) if k.last_used_ms else "never",
            show_time(k.revoked_ms) if k.revoked_ms else "-",
            k.name or "-",  # last: a name may hold spaces
        ]
        for k in resp.keys
    ]
    ctx.out.table(
        ["PREFIX", "ENVIRONMENT", "ROLE", "TIER", "CREATED", "LAST_USED", "REVOKED", "NAME"], rows
    )
    return 0


def generate(args: argparse.Namespace, ctx: Context) -> int:
    # The key format is public API (README, Security); fluxmqctl speaks only that, so it makes
    # the key itself (tests/cli check the broker's parser accepts it).
    kind = "live" if args.environment == "production" else "test"
    alphabet = string.ascii_letters + string.digits
    print(f"fmq_{kind}_sk_" + "".join(secrets.choice(alphabet) for _ in range(32)), flush=True)
    return 0


def revoke(args: argparse.Namespace, ctx: Context) -> int:
    key_id = key_id_of(args.key_id)
    confirm(f"Revoke API key {key_id}? Every client using it is refused from then on.", args.yes)
    info: apb.ApiKeyInfo = ctx.conn.call(
        ctx.conn.admin.RevokeApiKey, apb.RevokeApiKeyRequest(key_id=key_id)
    )
    if ctx.out.json:
        ctx.out.doc(message_dict(info))
    else:
        ctx.out.line(f"key {info.prefix or key_id} revoked ({info.name or 'unnamed'})")
    return 0
