"""A provider that cannot be reached fails the run with a detail that names where it was
called (scheme, host, port and path: a wrong ``base_url`` shows at once)."""

from __future__ import annotations

from app.config import AgentProfile

from ..lifecycle.harness import free_port
from .conftest import SettingsFactory, start_client


async def test_a_connection_error_names_the_url(make_settings: SettingsFactory) -> None:
    port = free_port()  # nothing listens there
    profile = AgentProfile(
        provider="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
    )
    app, client = await start_client(make_settings(agents={"local": profile}))
    async with app.router.lifespan_context(app), client:
        await client.post("/conversations", json={"id": "c"})
        ran = await client.post("/conversations/c/runs", json={"prompts": ["hi"], "agent": "local"})
        assert ran.status_code == 201, ran.text
        body = ran.json()
        assert body["status"] == "failed"
        assert f"http://127.0.0.1:{port}/v1/chat/completions" in body["error"]["detail"]
