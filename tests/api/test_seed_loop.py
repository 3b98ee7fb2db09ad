"""The seed's loop through HTTP: store Result.Context, replace the snapshot, and the second
run sees the first (contract §4, seed "Continuing a conversation")."""

from __future__ import annotations

from .conftest import AppClient


async def test_second_run_resolves_it_through_the_stored_context(client: AppClient) -> None:
    created = await client.post("/conversations", json={"system_prompt": "You are concise."})
    assert created.status_code == 201
    conv = created.json()["id"]
    assert created.headers["location"] == f"/conversations/{conv}"

    first = await client.post(f"/conversations/{conv}/runs", json={"prompts": ["What is nvim?"]})
    assert first.status_code == 201
    assert first.json()["status"] == "completed" and first.json()["stored"] is True
    assert first.headers["etag"] == first.json()["etag"]

    second = await client.post(
        f"/conversations/{conv}/runs", json={"prompts": ["How does it differ from vim?"]}
    )
    body = second.json()
    # the echo provider says what it was sent: both turns of the first run plus the new prompt
    assert body["final"]["content"][0]["text"] == (
        'Echo: I saw 3 messages. You said: "How does it differ from vim?"'
    )
    assert body["base_etag"] == first.json()["etag"]

    stored = await client.get(f"/conversations/{conv}/context")
    assert stored.json() == body["context"]
    assert stored.headers["etag"] == body["etag"]
    texts = [m["content"][0]["text"] for m in stored.json()["messages"] if m["type"] == "user"]
    assert texts == ["What is nvim?", "How does it differ from vim?"]
