"""Routes whose parameters are solved without FastAPI's generic dependency machinery, when a
request is ordinary; FastAPI's own handler otherwise.

FastAPI solves a route's parameters per request by walking its dependency tree: for each
dependency and each parameter it looks up the field's kind, aliases and annotation again,
builds a response object for dependencies to write into, and keys a cache. On the run route
that is about 8 % of a run's CPU. :class:`LeanRoute` works out once, when the route is built,
what that walk amounts to for a route made only of what it can solve itself (path and header
parameters of one value each, one JSON body, the request, and the dependencies of
:data:`RESOLVERS`), and then, per request:

- validates each path and header parameter and the body with FastAPI's own field of it
  (``ModelField.validate``: the same pydantic validator, constraints and defaults);
- takes a dependency's value from :data:`RESOLVERS` (the app's services; the tenant the
  authentication middleware put in the scope);
- calls the endpoint, which answers a :class:`~starlette.responses.Response` itself.

Anything else goes to FastAPI's handler, unchanged: a parameter or body that does not
validate (so every 422 is FastAPI's, word for word), a body that is not ``application/json``
or not JSON, a missing required header, a request the middleware did not authenticate. The
fast path accepts only requests FastAPI would accept, and passes the values FastAPI would
pass. A route it cannot solve (query or cookie parameters, another dependency, an endpoint
that returns a model for FastAPI to serialize) simply keeps FastAPI's handler. The OpenAPI
document is FastAPI's: it is built from the same route.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import params
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from .deps import authenticated_tenant, services, services_of, tenant

if TYPE_CHECKING:  # FastAPI's own types of a route's parts (not public names)
    from fastapi._compat import ModelField
    from fastapi.dependencies.models import Dependant

#: what stands for "FastAPI's handler decides" in a resolver's answer
FALL_BACK: Any = object()


def _tenant(request: Request) -> Any:
    found = authenticated_tenant(request)
    return FALL_BACK if found is None else found


#: the dependencies solved here, each by a function of the request: what the dependency
#: returns, or :data:`FALL_BACK`
RESOLVERS: dict[Callable[..., Any], Callable[[Request], Any]] = {
    services: services_of,
    tenant: _tenant,
}

#: the annotations of a parameter taken as one value (``str``, ``int``, optional or not)
_SCALARS = (str, int)
#: a parameter's defaults handed over as they are (immutable: FastAPI hands over a deep copy)
_DEFAULTS = (type(None), str, int)
#: the field settings under which FastAPI looks a parameter up by other names
_ALIAS_CONFIG = frozenset({"validate_by_alias", "validate_by_name", "populate_by_name"})


def _one_value(annotation: Any) -> bool:
    if annotation in _SCALARS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] in _SCALARS
    return False


def _is_json(content_type: str | None) -> bool:
    """``application/json`` (with parameters or not): a body FastAPI parses as JSON. Other
    JSON media types (``…+json``) are left to FastAPI."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == "application/json"


@dataclass(frozen=True)
class _Plan:
    """What solving a route's parameters amounts to (worked out when the route is built)."""

    #: the dependencies :data:`RESOLVERS` answers for, each with its resolver
    leaves: tuple[tuple[Callable[..., Any], Callable[[Request], Any]], ...]
    #: the dependencies made only of other dependencies, each after those it takes, with its
    #: arguments (parameter name, the dependency that gives it)
    composites: tuple[tuple[Callable[..., Any], tuple[tuple[str, Callable[..., Any]], ...]], ...]
    #: the endpoint's own dependencies: parameter name, dependency
    dependencies: tuple[tuple[str, Callable[..., Any]], ...]
    path: tuple[tuple[str, ModelField], ...]
    headers: tuple[tuple[str, str, ModelField], ...]  # name, alias, field
    body: tuple[str, ModelField] | None
    request_name: str | None

    async def solve(self, request: Request) -> dict[str, Any] | None:
        """The endpoint's arguments, or ``None``: FastAPI's handler decides.

        A resolver has no effect of its own; a composite dependency runs only once every
        parameter is valid, so a request that falls back to FastAPI has run none of them
        (FastAPI then runs each once, as always, and its errors come in its order)."""
        solved: dict[Callable[..., Any], Any] = {}
        for call, resolve in self.leaves:
            value = resolve(request)
            if value is FALL_BACK:
                return None
            solved[call] = value
        values: dict[str, Any] = {}
        path_params = request.path_params
        for name, field in self.path:
            raw = path_params.get(field.alias)
            if raw is None:
                return None
            value, errors = field.validate(raw, values, loc=("path", field.alias))
            if errors:
                return None
            values[name] = value
        if self.headers:
            headers = request.headers
            for name, alias, field in self.headers:
                raw = headers.get(alias)
                if raw is None:
                    if field.field_info.is_required():
                        return None
                    values[name] = field.default
                    continue
                value, errors = field.validate(raw, values, loc=("header", alias))
                if errors:
                    return None
                values[name] = value
        if self.body is not None:
            name, field = self.body
            if not _is_json(request.headers.get("content-type")) or not await request.body():
                return None
            try:
                document = await request.json()
            except Exception:  # not JSON, or nested too deep: FastAPI words the error
                return None
            value, errors = field.validate(document, values, loc=("body",))
            if errors:
                return None
            values[name] = value
        for call, arguments in self.composites:
            solved[call] = await call(**{name: solved[given] for name, given in arguments})
        for name, call in self.dependencies:
            values[name] = solved[call]
        if self.request_name is not None:
            values[self.request_name] = request
        return values


#: a dependant's parameters FastAPI fills with objects of its own
_SPECIAL_PARAMETERS = (
    "http_connection_param_name",
    "websocket_param_name",
    "background_tasks_param_name",
    "response_param_name",
    "security_scopes_param_name",
)


def _dependencies(
    dependant: Dependant,
    leaves: dict[Callable[..., Any], Callable[[Request], Any]],
    composites: dict[Callable[..., Any], tuple[tuple[str, Callable[..., Any]], ...]],
) -> tuple[tuple[str, Callable[..., Any]], ...] | None:
    """``dependant``'s dependencies (parameter name, dependency), each added to ``leaves`` or
    to ``composites`` (after those it takes); ``None`` when one cannot be solved here."""
    taken = []
    for sub in dependant.dependencies:
        call = sub.call
        if call is None or sub.name is None or not sub.use_cache:
            return None
        resolve = RESOLVERS.get(call)
        if resolve is not None:
            leaves[call] = resolve
        elif call not in composites:
            if (
                not inspect.iscoroutinefunction(call)
                or sub.path_params
                or sub.query_params
                or sub.header_params
                or sub.cookie_params
                or sub.body_params
                or sub.request_param_name
                or any(getattr(sub, special) for special in _SPECIAL_PARAMETERS)
            ):
                return None
            arguments = _dependencies(sub, leaves, composites)
            if arguments is None:
                return None
            composites[call] = arguments
        taken.append((sub.name, call))
    return tuple(taken)


def _plan(route: APIRoute) -> _Plan | None:
    """How ``route``'s parameters are solved here; ``None`` when FastAPI's handler must."""
    dependant = route.dependant
    if not inspect.iscoroutinefunction(route.endpoint):
        return None  # FastAPI runs it in its thread pool
    try:
        answer = typing.get_type_hints(route.endpoint).get("return")
    except (NameError, TypeError):
        return None
    if not (isinstance(answer, type) and issubclass(answer, Response)):
        return None  # FastAPI serializes what the endpoint returns
    if (
        dependant.query_params
        or dependant.cookie_params
        or any(getattr(dependant, special) for special in _SPECIAL_PARAMETERS)
    ):
        return None
    leaves: dict[Callable[..., Any], Callable[[Request], Any]] = {}
    composites: dict[Callable[..., Any], tuple[tuple[str, Callable[..., Any]], ...]] = {}
    dependencies = _dependencies(dependant, leaves, composites)
    if dependencies is None:
        return None
    for field in (*dependant.path_params, *dependant.header_params):
        info = field.field_info
        if (
            not _one_value(info.annotation)
            or info.validation_alias not in (None, info.alias)  # FastAPI chooses among them
            or _ALIAS_CONFIG.intersection(getattr(field, "config", None) or {})
            or info.validate_default
            or not (info.is_required() or isinstance(field.default, _DEFAULTS))
        ):
            return None
    headers = []
    for field in dependant.header_params:
        if not field.field_info.alias:  # FastAPI derives it (underscores): left to it
            return None
        headers.append((field.name, field.field_info.alias, field))
    body = None
    if dependant.body_params:
        if len(dependant.body_params) != 1 or route._embed_body_fields:
            return None
        field = dependant.body_params[0]
        info = field.field_info
        if (
            not isinstance(info, params.Body)
            or isinstance(info, params.Form)
            or getattr(info, "embed", False)
        ):
            return None
        body = (field.name, field)
    return _Plan(
        leaves=tuple(leaves.items()),
        composites=tuple(composites.items()),
        dependencies=dependencies,
        path=tuple((f.name, f) for f in dependant.path_params),
        headers=tuple(headers),
        body=body,
        request_name=dependant.request_param_name,
    )


class LeanRoute(APIRoute):
    """An :class:`APIRoute` that solves an ordinary request's parameters itself (module
    docstring), and hands every other request to FastAPI's handler; so does every request
    while the app has dependency overrides."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        standard = super().get_route_handler()
        try:
            plan = _plan(self)
        except (AttributeError, TypeError):  # a FastAPI whose route parts differ: its handler
            plan = None
        if plan is None:
            return standard
        endpoint = self.dependant.call
        assert endpoint is not None
        overrides = self.dependency_overrides_provider

        async def handler(request: Request) -> Response:
            if overrides is not None and getattr(overrides, "dependency_overrides", None):
                return await standard(request)
            values = await plan.solve(request)
            if values is None:
                return await standard(request)
            answer = await endpoint(**values)
            if not isinstance(answer, Response):
                raise TypeError(f"{endpoint.__name__} answered {type(answer).__name__}")
            return answer

        return handler


__all__ = ["RESOLVERS", "LeanRoute"]
