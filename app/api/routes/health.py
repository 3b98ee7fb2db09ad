"""Liveness, readiness and metrics (contract §4)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from app.observability import render_metrics
from app.service.metrics import observe_queue
from app.store.migrate import current_revision, head_revision

from ..deps import ServicesDep
from ..schemas import Health, McpServerReadiness, ProfileReadiness, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, operation_id="healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready"}},
    operation_id="readyz",
)
async def readyz(svc: ServicesDep) -> Response:
    """Ready when the database answers, its schema is at the head revision and at least one
    agent profile can run. Each profile is reported in `profiles`: one that cannot run (its
    provider key is unset) makes its own runs 503, not the whole server; its MCP servers are
    listed (kept listings count), each reported reachable or why not."""
    expected = head_revision()
    try:
        revision = await current_revision(svc.engine)
        reachable = True
    except Exception:
        revision, reachable = None, False
    unready = svc.agents.unready()
    servers = await svc.runs.state.mcp.reachability(svc.agents.mcp_servers())
    profiles = {
        name: ProfileReadiness(
            ready=name not in unready,
            reason=unready.get(name),
            mcp_servers={
                label: McpServerReadiness(reachable=why is None, reason=why)
                for label, why in servers.get(name, {}).items()
            },
        )
        for name in svc.agents.names
    }
    can_run = any(p.ready for p in profiles.values())
    ready = reachable and revision == expected and can_run
    body = Readiness(
        status="ready" if ready else "not_ready",
        database=reachable,
        schema_revision=revision,
        expected_revision=expected,
        profiles=profiles,
        unready_profiles=unready,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if ready else 503)


@router.get(
    "/metrics",
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition",
        }
    },
    operation_id="metrics",
)
async def metrics(svc: ServicesDep) -> Response:
    """Prometheus metrics."""
    await observe_queue(svc.stores.queue)  # the queue's depth, as the database has it now
    body, content_type = render_metrics()
    return Response(body, media_type=content_type)
