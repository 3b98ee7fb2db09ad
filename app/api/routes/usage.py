"""``GET /usage``: the caller's tenant's totals by day and where it stands against its quota
(docs/operations.md "Quotas")."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from app.store.quotas import QuotaStore

from ..deps import ServicesDep, TenantDep
from ..problems import problem_responses

router = APIRouter(tags=["usage"])

#: the header block a 429 quota-exceeded answer carries (the run routes document it)
QUOTA_HEADERS: dict[str, Any] = {
    "Retry-After": {"description": "Seconds until a run may start", "schema": {"type": "integer"}},
    "RateLimit-Policy": {
        "description": 'The tenant\'s quota policies, e.g. `"runs-per-minute";q=5;w=60`',
        "schema": {"type": "string"},
    },
    "RateLimit": {
        "description": 'The exceeded policy: `"runs-per-minute";r=0;t=37`',
        "schema": {"type": "string"},
    },
}
QUOTA_RESPONSE: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "The tenant's quota is spent (`quota-exceeded`); nothing ran",
        "headers": QUOTA_HEADERS,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
        },
    }
}


class UsageDay(BaseModel):
    day: str = Field(description="UTC day, YYYY-MM-DD")
    runs: int = Field(description="Runs started that day")
    input_tokens: int = Field(description="Input tokens (cached ones included) of runs ended")
    output_tokens: int
    cached_tokens: int = Field(description="Input tokens read from a provider's prompt cache")


class QuotaLimits(BaseModel):
    tokens_per_day: int | None
    runs_per_minute: int | None
    concurrent_runs: int | None


class QuotaState(BaseModel):
    limits: QuotaLimits | None = Field(description="null: the tenant has no quota")
    runs_last_minute: int
    running: int
    tokens_today: int = Field(description="Input + output tokens of runs ended today (UTC)")


class Usage(BaseModel):
    tenant: str
    days: list[UsageDay] = Field(description="Newest first; days without runs left out")
    quota: QuotaState


@router.get(
    "/usage",
    response_model=Usage,
    responses=problem_responses(422),
    operation_id="get_usage",
)
async def get_usage(
    svc: ServicesDep,
    tenant: TenantDep,
    days: Annotated[int, Query(ge=1, le=366, description="How many days back")] = 30,
) -> Usage:
    """The caller's tenant: runs and tokens by day, and its quota state now."""
    found, state = await QuotaStore(svc.engine, svc.runs.clock).usage(tenant, days)
    quota = state.quota
    return Usage(
        tenant=tenant,
        days=[UsageDay(**vars(d)) for d in found],
        quota=QuotaState(
            limits=None
            if quota is None
            else QuotaLimits(
                tokens_per_day=quota.tokens_per_day,
                runs_per_minute=quota.runs_per_minute,
                concurrent_runs=quota.concurrent_runs,
            ),
            runs_last_minute=state.runs_last_minute,
            running=state.running,
            tokens_today=state.tokens_today,
        ),
    )
