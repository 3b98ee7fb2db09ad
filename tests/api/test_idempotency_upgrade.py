"""``Idempotency-Key`` fingerprints cover what the client sent (app/api/fingerprint.py): a repeat
still replays after the request model gained a field, the same JSON written differently is the
same request, and keys stored in the earlier form (a hash of the parsed model) still match
during their retention."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from sqlalchemy import select, update

from app.api.fingerprint import LATER_FIELDS
from app.api.schemas import RunCreate
from app.store.tables import idempotency_keys

from ..helpers import assert_problem
from .conftest import AppClient

BODY = {"prompts": ["once"], "on_failure": "keep"}


async def _conversation(client: AppClient) -> str:
    created = await client.post("/conversations", json={})
    assert created.status_code == 201
    conv: str = created.json()["id"]
    return conv


async def _post(client: AppClient, conv: str, content: bytes, key: str) -> Any:
    return await client.post(
        f"/conversations/{conv}/runs",
        content=content,
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )


async def _runs(client: AppClient, conv: str) -> int:
    return len((await client.get(f"/conversations/{conv}/runs")).json()["items"])


async def test_a_repeat_replays_after_the_request_model_gained_a_field(
    client: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = await _conversation(client)
    first = await _post(client, conv, json.dumps(BODY).encode(), "k-upgrade")
    assert first.status_code == 201

    # The upgrade: the model now has one more field with a default (as tools, approvals and
    # require_approval were added), which every parsed body carries.
    dump = RunCreate.model_dump

    def with_new_field(self: RunCreate, **kwargs: Any) -> dict[str, Any]:
        return {**dump(self, **kwargs), "added_later": None}

    monkeypatch.setattr(RunCreate, "model_dump", with_new_field)
    again = await _post(client, conv, json.dumps(BODY).encode(), "k-upgrade")
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert await _runs(client, conv) == 1


async def test_the_same_json_written_differently_is_the_same_request(client: AppClient) -> None:
    conv = await _conversation(client)
    first = await _post(client, conv, b'{"prompts":["caf\\u00e9"],"on_failure":"keep"}', "k-form")
    assert first.status_code == 201
    reordered = '{\n  "on_failure" : "keep",\n  "prompts" : [ "café" ]\n}'.encode()
    again = await _post(client, conv, reordered, "k-form")
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()

    other = await _post(client, conv, b'{"prompts":["cafe"],"on_failure":"keep"}', "k-form")
    assert_problem(other, 422, "idempotency-key-mismatch")
    assert await _runs(client, conv) == 1


def _stored_before(body: dict[str, Any]) -> str:
    """What the previous version stored for a body: a hash of the parsed model (which had
    none of the fields added since)."""
    parsed = RunCreate.model_validate(body).model_dump(mode="json", exclude=set(LATER_FIELDS))
    return hashlib.sha256(
        json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


async def test_a_key_stored_in_the_earlier_form_still_replays(client: AppClient) -> None:
    conv = await _conversation(client)
    first = await _post(client, conv, json.dumps(BODY).encode(), "k-old")
    assert first.status_code == 201
    engine = client.app.state.services.stores.engine
    async with engine.begin() as conn:  # as the previous version wrote it
        await conn.execute(
            update(idempotency_keys)
            .where(idempotency_keys.c.key == "k-old")
            .values(request_hash=_stored_before(BODY))
        )
        stored = (
            await conn.execute(
                select(idempotency_keys.c.request_hash).where(idempotency_keys.c.key == "k-old")
            )
        ).scalar_one()
    assert ":" not in stored

    # the earlier form compared the parsed model: a differently written body matched then too
    again = await _post(client, conv, b'{"on_failure": "keep", "prompts": ["once"]}', "k-old")
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    other = await _post(client, conv, json.dumps({"prompts": ["twice"]}).encode(), "k-old")
    assert_problem(other, 422, "idempotency-key-mismatch")
    assert await _runs(client, conv) == 1
