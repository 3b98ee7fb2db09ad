"""How the API answers database faults, in process (docs/faults.md): the store is made to fail
where the test says, on the real app and database.

- a database fault on any route is ``503 database-unavailable`` with ``Retry-After``, and the
  connection stays usable (no ``Connection: close``);
- any 500 that remains says ``Connection: close`` (the server drops the connection after it);
- a run's outcome write is retried while the database fails transiently; when it still fails
  after ``outcome_retry_seconds`` the client gets 503 ``stored: false`` (a stream: an ``error``
  event, then the end of the body) and the run record ends ``interrupted`` naming the outage.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy.exc

from app.api.app import create_app
from app.config import Settings
from app.store.conversations import ConversationStore
from app.store.runs import RunStore

from ..helpers import assert_problem, until, user_texts


def _lost() -> Exception:
    """What a dropped PostgreSQL connection arrives as (SQLAlchemy's view of it)."""
    return sqlalchemy.exc.DBAPIError(
        "SELECT 1", {}, Exception("connection was closed"), connection_invalidated=True
    )


@pytest.fixture
def app_client(database_url: str) -> Callable[..., Any]:
    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
        settings = Settings(database_url=database_url, lease_seconds=2.0, **overrides)
        app = create_app(settings)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://carryover.test") as http,
        ):
            yield http

    return start


async def _conversation(http: httpx.AsyncClient) -> str:
    created = await http.post("/conversations", json={})
    assert created.status_code == 201, created.text
    conv: str = created.json()["id"]
    return conv


async def test_a_database_fault_on_a_route_is_503_with_retry_after(
    app_client: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with app_client() as http:
        conv = await _conversation(http)

        async def lost(*args: object, **kwargs: object) -> Any:
            raise _lost()

        monkeypatch.setattr(ConversationStore, "load_context", lost)
        monkeypatch.setattr(ConversationStore, "load_context_rows", lost)  # GET context reads rows
        answer = await http.get(f"/conversations/{conv}/context")
        body = assert_problem(answer, 503, "database-unavailable")
        assert answer.headers["retry-after"] == "1"
        assert "connection" not in answer.headers  # handled: the connection stays usable
        assert "connection lost" in body["detail"]

        async def refused(*args: object, **kwargs: object) -> Any:
            raise ConnectionRefusedError(111, "Connect call failed")

        monkeypatch.setattr(ConversationStore, "summarize_conversation", refused)
        answer = await http.get(f"/conversations/{conv}")
        assert_problem(answer, 503, "database-unavailable")
        assert answer.headers["retry-after"] == "2"


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("a bug"),
        sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key")),
    ],
    ids=["bug", "not-a-fault"],
)
async def test_a_500_says_connection_close(
    app_client: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    async with app_client() as http:
        conv = await _conversation(http)

        async def broken(*args: object, **kwargs: object) -> Any:
            raise error

        monkeypatch.setattr(ConversationStore, "load_context", broken)
        monkeypatch.setattr(ConversationStore, "load_context_rows", broken)
        answer = await http.get(f"/conversations/{conv}/context")
        assert_problem(answer, 500, "internal")
        assert answer.headers["connection"] == "close"
        assert "duplicate" not in answer.text and "a bug" not in answer.text


async def test_the_outcome_write_is_retried_through_transient_faults(
    app_client: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunStore.finish_run
    calls = []

    async def flaky(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= 3:
            raise _lost()
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(RunStore, "finish_run", flaky)
    async with app_client(outcome_retry_seconds=30) as http:
        conv = await _conversation(http)
        answer = await http.post(f"/conversations/{conv}/runs", json={"prompts": ["kept"]})
        assert answer.status_code == 201, answer.text
        assert answer.json()["status"] == "completed"
        assert len(calls) == 4
        context = (await http.get(f"/conversations/{conv}/context")).json()
        assert user_texts(context["messages"]) == ["kept"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_outcome_that_cannot_be_written_is_503_not_stored_then_interrupted(
    app_client: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    async def down(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        raise _lost()

    monkeypatch.setattr(RunStore, "finish_run", down)
    async with app_client(outcome_retry_seconds=0.3) as http:
        conv = await _conversation(http)
        body = {"prompts": ["lost"], "stream": stream}
        if stream:
            async with http.stream("POST", f"/conversations/{conv}/runs", json=body) as answer:
                assert answer.status_code == 201
                text = (await answer.aread()).decode()  # the whole body: it ends
            events = [
                (block.split("\n")[0].removeprefix("event: "), block.split("\n")[1][6:])
                for block in text.strip().split("\n\n")
            ]
            assert events[0][0] == "run.started"
            assert events[-1][0] == "error", events
            assert "run.finished" not in [name for name, _ in events]
            problem = json.loads(events[-1][1])
            assert problem["type"].endswith("/database-unavailable")
        else:
            answer = await http.post(f"/conversations/{conv}/runs", json=body)
            problem = assert_problem(answer, 503, "database-unavailable")
            assert answer.headers["retry-after"] == "1"
        assert problem["stored"] is False
        assert "could not be stored" in problem["detail"]
        run_id = problem["run_id"]

        async def ended() -> dict[str, Any] | None:
            record = (await http.get(f"/conversations/{conv}/runs/{run_id}")).json()
            return None if record["status"] == "running" else record

        record = await until(ended, what="the run's record to end")
        assert record["status"] == "interrupted"
        assert record["error"]["code"] == "database_unavailable"
        assert "could not be stored" in record["error"]["detail"]
        assert (await http.get(f"/conversations/{conv}")).json()["active_run_id"] is None
        context = (await http.get(f"/conversations/{conv}/context")).json()
        assert context["messages"] == []
