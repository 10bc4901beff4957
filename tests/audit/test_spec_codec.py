"""The fault injector's codec (tests/audit/spec_codec.py) writes what RECORD_BATCH.md says: it
reproduces the shared test vector byte for byte, and reads it back."""

from __future__ import annotations

import json
from pathlib import Path

from tests.audit import spec_codec

VECTOR = Path(__file__).parents[2] / "proto" / "fluxmq" / "v1" / "record_batch_vector.json"


def test_spec_codec_reads_and_writes_the_shared_vector() -> None:
    cases = json.loads(VECTOR.read_text())["cases"]
    assert cases
    for case in cases:
        stored = bytes.fromhex(case["batch_hex"])
        batch = spec_codec.decode(case["log_id"], case["base_offset"], stored)
        assert (batch.producer_id, batch.producer_epoch, batch.first_sequence) == (
            case["producer_id"],
            case["producer_epoch"],
            case["first_sequence"],
        )
        for record, want in zip(batch.records, case["records"], strict=True):
            assert record.timestamp_ms == want["timestamp_ms"]
            assert record.value == bytes.fromhex(want["value_hex"])
            key = want["key_hex"]
            assert record.key == (None if key is None else bytes.fromhex(key))
            assert record.idempotency_key == want["idempotency_key"]
        assert spec_codec.encode(case["log_id"], batch) == stored, case["name"]


def test_a_batch_moved_to_another_place_fails_the_spec_codecs_crc() -> None:
    case = json.loads(VECTOR.read_text())["cases"][0]
    stored = bytes.fromhex(case["batch_hex"])
    try:
        spec_codec.decode(case["log_id"], case["base_offset"] + 1, stored)
    except spec_codec.SpecDecodeError as err:
        assert "crc32c" in str(err)
    else:
        raise AssertionError("a batch at the wrong place passed its crc")


def test_log_metadata_round_trips_with_its_crc() -> None:
    raw = spec_codec.encode_meta(42, 3, 10, 700)
    assert spec_codec.decode_meta(42, raw) == (3, 10, 700)
    damaged = bytes([raw[0] ^ 1]) + raw[1:]
    try:
        spec_codec.decode_meta(42, damaged)
    except spec_codec.SpecDecodeError:
        return
    raise AssertionError("damaged metadata passed its crc")
