"""API-key administration: create (the secret is returned once), list, revoke, and the bootstrap
key an operator starts from. Keys live in the metadata store. An admin key manages the keys of
its own environment; a production admin key (the operator's: the bootstrap key is one) manages
every environment's, so that it can hand out the first key of development and staging."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from typing import Protocol

from fluxmq._pb.v1 import admin_pb2 as apb
from fluxmq.core.auth import (
    ACTIVE_KEYS_PER_ENV_ROLE_MAX,
    SALT_BYTES,
    KeyRecord,
    check_new_key,
    hash_key,
    kind_of,
    new_key,
    parse_key,
    permission_denied,
)
from fluxmq.core.errors import FluxError
from fluxmq.metadata.metadata import (
    AlreadyExists,
    LimitExceeded,
    MetadataError,
    MetadataRefused,
    NotFound,
)
from fluxmq.server.guard import Identity, KeyCache

log = logging.getLogger("fluxmq.auth")


class KeyAdminStore(Protocol):
    async def create_api_key(self, record: KeyRecord, active_max: int) -> None: ...

    async def revoke_api_key(self, key_id: str, revoked_ms: int) -> KeyRecord: ...

    async def list_api_keys(self) -> list[KeyRecord]: ...

    async def list_api_key_usage(self) -> dict[str, int]: ...


def may_manage(identity: Identity, environment: str) -> bool:
    return identity.environment in ("production", environment)


def info(record: KeyRecord, last_used_ms: int = 0) -> apb.ApiKeyInfo:
    return apb.ApiKeyInfo(
        key_id=record.key_id,
        prefix=record.prefix,
        name=record.name,
        environment=record.environment,
        role=record.role,
        tier=record.tier,
        created_ms=record.created_ms,
        last_used_ms=last_used_ms,
        revoked_ms=record.revoked_ms,
    )


def make_record(
    key: str, name: str, environment: str, role: str, tier: str, now_ms: int
) -> KeyRecord:
    presented = parse_key(key)
    assert presented is not None and presented.kind == kind_of(environment), "a malformed new key"
    salt = secrets.token_bytes(SALT_BYTES)
    return KeyRecord(
        key_id=presented.key_id,
        name=name,
        environment=environment,
        role=role,
        tier=tier,
        salt=salt,
        digest=hash_key(salt, key),
        created_ms=now_ms,
    )


class KeyAdmin:
    def __init__(
        self,
        store: KeyAdminStore,
        cache: KeyCache,
        tiers: Iterable[str],
        now_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._cache = cache
        self._tiers = sorted(tiers)
        self._now_ms = now_ms

    async def create(
        self, identity: Identity, request: apb.CreateApiKeyRequest
    ) -> apb.CreateApiKeyResponse:
        environment = request.environment or identity.environment
        if not may_manage(identity, environment):
            raise permission_denied(
                f"a {identity.environment} admin key cannot create {environment} keys",
                environment=identity.environment,
            )
        tier = request.tier or "default"
        try:
            check_new_key(
                request.name, environment, request.role, tier, self._tiers,
                self._cache.records.values(),
            )  # fmt: skip
        except FluxError as err:
            if err.reason != "KEY_LIMIT_REACHED":
                raise
            # The cache may not have seen a revocation made through another node yet; the
            # store is the authority on the limit.
            try:
                await self._cache.ensure_loaded()
            except Exception as load_err:
                raise translate(load_err) from load_err
            check_new_key(
                request.name, environment, request.role, tier, self._tiers,
                self._cache.records.values(),
            )  # fmt: skip
        key = new_key(environment)
        record = make_record(key, request.name, environment, request.role, tier, self._now_ms())
        try:
            await self._store.create_api_key(record, ACTIVE_KEYS_PER_ENV_ROLE_MAX)
        except Exception as err:
            mapped = translate(err)
            if mapped.reason == "KEY_LIMIT_REACHED":
                mapped.metadata.update(environment=environment, role=request.role)
            raise mapped from err
        self._cache.records[record.key_id] = record
        return apb.CreateApiKeyResponse(key=key, info=info(record))

    async def list(
        self, identity: Identity, request: apb.ListApiKeysRequest
    ) -> apb.ListApiKeysResponse:
        try:
            records = await self._store.list_api_keys()
            usage = await self._store.list_api_key_usage()
        except Exception as err:
            raise translate(err) from err
        mine = [
            r
            for r in records
            if may_manage(identity, r.environment) and (r.active or request.include_revoked)
        ]
        mine.sort(key=lambda r: (r.created_ms, r.key_id))
        return apb.ListApiKeysResponse(keys=[info(r, usage.get(r.key_id, 0)) for r in mine])

    async def revoke(self, identity: Identity, request: apb.RevokeApiKeyRequest) -> apb.ApiKeyInfo:
        record = self._cache.records.get(request.key_id)
        if record is None or not may_manage(identity, record.environment):
            # Keys of other environments are not revealed, not even that they exist.
            raise FluxError(
                "API_KEY_NOT_FOUND",
                f"no API key {request.key_id!r} in the {identity.environment} environment",
                metadata={"key_id": request.key_id},
            )
        try:
            revoked = await self._store.revoke_api_key(request.key_id, self._now_ms())
        except Exception as err:
            raise translate(err) from err
        self._cache.records[revoked.key_id] = revoked
        return info(revoked)


async def ensure_bootstrap_key(
    store: KeyAdminStore, key: str, environment: str, now_ms: int
) -> bool:
    """Register ``key`` as an admin key of ``environment`` unless that environment already has
    an active admin key; -> whether it was registered. Idempotent across restarts and nodes
    (the store refuses a second record with the same id)."""
    presented = parse_key(key)
    if presented is None or presented.kind != kind_of(environment):
        raise FluxError(
            "INVALID_ARGUMENT",
            f"auth_bootstrap_key: not a fmq_{kind_of(environment)}_sk_<32 characters> key "
            f"(the key of a {environment} admin)",
        )
    try:
        records = await store.list_api_keys()
    except Exception as err:
        raise translate(err) from err
    if any(r.key_id == presented.key_id for r in records):
        return False
    if any(r.active and r.environment == environment and r.role == "admin" for r in records):
        log.info("the %s environment has an admin key: bootstrap key not registered", environment)
        return False
    record = make_record(key, "bootstrap", environment, "admin", "default", now_ms)
    try:
        await store.create_api_key(record, ACTIVE_KEYS_PER_ENV_ROLE_MAX)
    except Exception as err:
        mapped = translate(err)
        if mapped.reason in ("KEY_LIMIT_REACHED", "API_KEY_EXISTS"):
            return False  # another node registered it a moment ago
        raise mapped from err
    log.warning("registered the bootstrap admin key %s for %s", record.prefix, environment)
    return True


def translate(err: Exception) -> FluxError:
    """Metadata-store errors of key operations as domain errors."""
    if isinstance(err, FluxError):
        return err
    if isinstance(err, LimitExceeded):
        return FluxError("KEY_LIMIT_REACHED", str(err))
    if isinstance(err, AlreadyExists):
        return FluxError("API_KEY_EXISTS", str(err))
    if isinstance(err, NotFound):
        return FluxError("API_KEY_NOT_FOUND", str(err))
    if isinstance(err, MetadataRefused):  # the node's etcd credentials: no retry fixes that
        return FluxError("METADATA_UNAVAILABLE", f"API keys are unavailable: {err}")
    if isinstance(err, MetadataError):
        return FluxError(
            "METADATA_UNAVAILABLE",
            f"API keys are unavailable: {err}",
            retriable=True,
            retry_after_ms=1000,
        )
    raise err
