"""``Agent.run``: one run of the agent on a context and new prompts (contract §2, §3).

The run goes through fixed stages, and where it ends decides what its Result holds:

1. check the input (:meth:`Agent.check`): client tools, approvals, answers to pending calls —
   a refusal raises before anything runs (docs/tools.md);
2. compact before admission when the estimate passes ``compact_at`` of the window;
3. admit the answers to the pending calls (running the approved ones), then the prompts;
4. attempts and tool batches until the model answers without calling a tool, or calls a client
   tool or an approval-gated tool: then the run ends ``requires_action``.

A run that fails or is cancelled closes the calls it started but could not finish with
``interrupted`` results, so the only unanswered calls a returned context keeps are pending ones.

Failures never raise: a failed or cancelled run returns a Result whose ``status`` and
``error`` say how it ended. Cancelling the task that awaits :meth:`Agent.run` cancels the run at
whatever it is awaiting (a provider stream, a tool batch, a compaction) and the call returns
the cancelled Result instead of raising :class:`asyncio.CancelledError`.

Cost on long contexts: the run keeps a running token tally (given in ``Input.tokens`` or
counted once), so deciding whether to compact never recounts the history. The CPU-heavy steps
whose cost grows with the context — counting it, choosing a cut, rendering and building the
fold — run in a worker thread (:func:`~app.agent.offload.offload`) once the context holds
:data:`~app.agent.offload.OFFLOAD_MESSAGES` messages, so the event loop is never held for their
duration.

The stages live in modules of their own: the config, plan and run state in
:mod:`app.agent.state`, the tool batches in :mod:`app.agent.batches`, compaction in
:mod:`app.agent.compaction_stage`, and what a provider is sent in :mod:`app.agent.opaque`;
this module holds :class:`Agent` itself, its run loop and the attempts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from app import telemetry

from .assembly import AttemptBuilder
from .batches import _ToolBatches
from .compaction_stage import _Folding
from .events import Delta, EventSink, MessageCompleted
from .mcp import McpToolset, RunTools, list_servers
from .mcp import build as build_toolset
from .mcp.servers import check_labels
from .messages import (
    AnyMessage,
    AssistantMessage,
    AttemptError,
    Context,
    ToolCallBlock,
    UserMessage,
    text_of,
)
from .offload import offload, offload_text
from .opaque import for_provider, is_prepared, prepare, view_of
from .pending import (
    Kinds,
    PendingCall,
    UnexpectedAnswer,
    classify,
    pending_calls,
    plan_resume,
    required_action,
    validate_approval_names,
    validate_client_tools,
)
from .providers.base import Provider, ProviderError, ProviderRequest, wire_of
from .providers.wire import WireFormat
from .records import CompactionReason, Input, Result, RunStatus
from .replay import open_batch
from .sizes import ContextSize, SizeBounds, passed_reason, size_of, too_large
from .state import CANCELLED, AgentConfig, RunPlan, _Emitter, _error, _RunFailed, _shielded, _State
from .structured import NOT_RETRIED, answer_violation, correction
from .tokens import TokenTally, estimate_with, heuristic_text_tokens, tally_of
from .tools import BUILTIN_LABEL, CallRunner

__all__ = ["Agent", "AgentConfig", "RunPlan", "for_provider"]


class Agent(_ToolBatches, _Folding):
    """Runs conversations. Keeps nothing between calls; safe to share across tasks."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    @property
    def provider(self) -> Provider:
        return self.config.provider

    @property
    def _wire(self) -> WireFormat | None:
        """The provider's wire format, when it sends the history encoded (app.agent.opaque)."""
        return wire_of(self.config.provider)

    async def run(self, input: Input, *, on_event: EventSink | None = None) -> Result:
        """Run on ``input.context`` plus ``input.prompts``; never mutates the input.

        Raises the refusals of :meth:`check` before anything runs; every other way a run can
        end is a Result.
        """
        if input.mcp_tools is None and (self.config.mcp_servers or input.mcp_servers):
            input = input.model_copy(update={"mcp_tools": await self.list_tools(input)})
        plan = self.check(input)
        return await self._guarded(
            input.context,
            input.prompts,
            None,
            on_event,
            input.tokens,
            plan=plan,
            bounds=input.bounds,
            size=input.size,
        )

    def check(self, input: Input) -> RunPlan:
        """Validate an input without running it (pure, cheap: O(the last tool batch)).

        Raises :class:`~app.agent.pending.InvalidTools` for bad client tools, approval names or
        MCP server labels (and, when ``input.mcp_tools`` is given, a client tool named like an
        MCP tool), :class:`~app.agent.pending.UnexpectedAnswer` for an answer to a call that is
        not pending (or a second one, or an approval of a call to an MCP server this run does
        not declare), :class:`~app.agent.pending.ToolResultsRequired` when a pending call is
        left unanswered.
        """
        server = self.config.tools.tools
        check_labels(input.mcp_servers, "mcp_servers", self.config.mcp_servers)
        toolset = input.mcp_tools
        remote = (
            {n: f"a tool of MCP server {t.server.label!r}" for n, t in toolset.tools.items()}
            if toolset is not None
            else None
        )
        client = validate_client_tools(input.client_tools, server, remote)
        gated = validate_approval_names(input.require_approval, server)
        kinds = input.pending_kinds
        resume = plan_resume(input.context, input.tool_results, input.approvals, server, kinds)
        if resume is not None:
            declared = {s.label for s in (*self.config.mcp_servers, *input.mcp_servers)}
            for call in resume.approved:
                label = call.server_label
                if label is not None and label != BUILTIN_LABEL and label not in declared:
                    raise UnexpectedAnswer(
                        call.id,
                        f"is a call to MCP server {label!r}, which this run does not name: "
                        "send its tools entry again to run it (or deny it)",
                    )
        specs = self.config.tools.specs
        labels = dict.fromkeys(server, BUILTIN_LABEL)
        holds = frozenset(t.name for t in client) | gated | self.config.approval_required
        runner: CallRunner = self.config.tools
        if toolset is not None:
            specs = (*specs, *toolset.specs)
            labels.update((n, t.server.label) for n, t in toolset.tools.items())
            holds |= toolset.gated
            runner = RunTools(self.config.tools, toolset, self.config.mcp)
        return RunPlan(
            tools=(*specs, *(t.spec for t in client)) if client else specs,
            holds=holds,
            resume=resume,
            settings=input.settings,
            runner=runner,
            client_names=frozenset(t.name for t in client),
            labels=labels,
            kinds=kinds,
            mcp=toolset,
        )

    async def list_tools(self, input: Input) -> McpToolset | None:
        """What the MCP servers of the agent and of ``input`` offer this run (None: there are
        none), from the listing cache or listed now, concurrently. A server that cannot be
        listed is the toolset's ``failure`` (a run on it fails before admission); a tool name
        found twice (two servers, or a server and a tool of the agent or of the run) raises
        :class:`~app.agent.pending.InvalidTools` (``mcp_servers[i]`` for the run's own
        servers)."""
        servers = (*self.config.mcp_servers, *input.mcp_servers)
        if not servers:
            return None
        check_labels(input.mcp_servers, "mcp_servers", self.config.mcp_servers)
        if self.config.mcp is None:
            raise RuntimeError("MCP servers are named, but the agent has no MCP client")
        listed = await list_servers(self.config.mcp, servers)
        taken = dict.fromkeys(self.config.tools.tools, "a server tool of this agent")
        taken.update((t.name, "a client tool of this run") for t in input.client_tools)
        where = {s.label: f"mcp_servers[{i}]" for i, s in enumerate(input.mcp_servers)}
        return build_toolset(servers, listed, taken, where)

    def pending_calls(
        self, context: Context, kinds: Kinds | None = None
    ) -> tuple[PendingCall, ...]:
        """The calls ``context`` is waiting on, with their kind (see :mod:`app.agent.pending`)."""
        return pending_calls(context, self.config.tools.tools, kinds)

    def classify(
        self, calls: Iterable[ToolCallBlock], kinds: Kinds | None = None
    ) -> tuple[PendingCall, ...]:
        """Pending calls (as a conversation row keeps them) with their kind: the one stored
        with them (``kinds``), else the rule of :func:`app.agent.pending.kind_of`."""
        return classify(calls, self.config.tools.tools, kinds)

    async def compact(
        self,
        context: Context,
        *,
        on_event: EventSink | None = None,
        tokens: TokenTally | None = None,
        bounds: SizeBounds | None = None,
        size: ContextSize | None = None,
    ) -> Result:
        """Compact now (contract §4 ``POST …/compact``): fold all but the current turn.

        ``tokens``, ``bounds``, ``size``: as in ``Input`` (with ``bounds``, the fold is deep
        enough for what stays to be well within them)."""
        return await self._guarded(
            context, (), "manual", on_event, tokens, bounds=bounds, size=size
        )

    async def _guarded(
        self,
        context: Context,
        prompts: tuple[UserMessage, ...],
        compact: CompactionReason | None,
        on_event: EventSink | None,
        tokens: TokenTally | None = None,
        *,
        plan: RunPlan | None = None,
        bounds: SizeBounds | None = None,
        size: ContextSize | None = None,
    ) -> Result:
        emit = _Emitter(on_event)
        state = _State(
            context=context,
            tally=tokens or TokenTally(),
            plan=plan or RunPlan(tools=self.config.tools.specs),
            bounds=bounds,
            size=size if bounds is not None else None,
        )
        state.kinds.update(state.plan.kinds or {})
        try:
            if tokens is None:
                state.tally = await offload(len(context.messages), tally_of, context.messages)
            if bounds is not None and size is None:
                state.size = await offload(
                    len(context.messages),
                    size_of,
                    context.system_prompt,
                    context.summary,
                    context.messages,
                )
            if compact is not None:
                await self._compact(state, emit, compact, keep_last=True)
            else:
                # what the provider is sent, walked once if this Context object has no view
                # yet; every append then carries it over (app.agent.opaque). Remembered: no
                # walk, so no worker thread either, however long the context.
                if not is_prepared(context, self.provider.name, self._wire):
                    await offload(
                        len(context.messages), prepare, context, self.provider.name, self._wire
                    )
                await self._run(state, prompts, emit)
        except _RunFailed as failed:
            await self._close_unfinished(state, emit)
            return self._result(state, "failed", failed.error)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._close_unfinished(state, emit)
            return self._result(state, "cancelled", CANCELLED)
        return self._result(state, "completed" if compact is not None else None)

    def _result(
        self, state: _State, status: RunStatus | None, error: AttemptError | None = None
    ) -> Result:
        """``status`` None: the run ended by itself, paused if calls are pending."""
        pending = pending_calls(state.context, self.config.tools.tools, state.kinds)
        if status is None:
            status = "requires_action" if pending else "completed"
        return state.result(status, error, required_action(pending))

    async def _run(self, state: _State, prompts: tuple[UserMessage, ...], emit: _Emitter) -> None:
        cfg = self.config
        unlisted = state.plan.mcp.failure_error() if state.plan.mcp is not None else None
        if unlisted is not None:  # before anything is admitted: nothing of the run is stored
            raise _RunFailed(unlisted)
        resume = state.plan.resume
        if prompts or resume is not None:
            ctx = state.context
            answers = () if resume is None else resume.results
            incoming: tuple[AnyMessage, ...] = (*answers, *prompts)
            projected = estimate_with(state.tally.extend(incoming), ctx.system_prompt, ctx.summary)
            by_tokens = projected > cfg.compact_at * cfg.context_window
            by_size = _near(state, incoming)
            if (by_tokens or by_size) and ctx.messages:
                # a compaction for size alone that finds nothing to fold is no failure: the
                # bounds themselves are checked right after
                await self._compact(
                    state, emit, "threshold", keep_last=False, required=by_tokens, incoming=incoming
                )
            _check_bounds(state, incoming)  # nothing past a bound is admitted
            if resume is not None:
                await self._answer_pending(state, emit, resume)
            state.append(*prompts)
            state.admitted = True
            for prompt in prompts:
                await emit(MessageCompleted(prompt))
        holds = state.plan.holds
        for turn in range(cfg.max_turns):
            if turn:  # tool results joined the context: keep it within its bounds
                if _near(state) and state.context.messages:
                    await self._compact(state, emit, "threshold", keep_last=True, required=False)
                _check_bounds(state)
            message = await self._answer(state, emit)
            calls = message.tool_calls
            if not calls:
                if await self._corrected(state, emit, message):
                    continue  # the model is told what broke the schema, and answers again
                return
            runnable = tuple(c for c in calls if c.name not in holds)
            if runnable:
                await self._tool_batch(state, emit, runnable)
            if len(runnable) < len(calls):
                return  # paused: the held calls are pending, the application answers them
        raise _RunFailed(
            AttemptError(
                kind="fatal",
                message=f"the model kept calling tools for {cfg.max_turns} turns",
                code="max_turns",
            )
        )

    async def _corrected(self, state: _State, emit: _Emitter, message: AssistantMessage) -> bool:
        """A final answer checked against the run's output schema: True when it broke it and
        a correction was appended (retried); raises _RunFailed when it broke it for good."""
        schema = state.plan.settings.output_schema
        if schema is None:
            return False
        problem = await offload_text(len(text_of(message)), answer_violation, schema, message)
        if problem is None:
            return False
        retried = state.corrections
        if message.stop_reason in NOT_RETRIED or retried >= self.config.output_retries:
            why = {"refusal": "the model refused", "content_filter": "the answer was filtered"}
            reason = why.get(message.stop_reason)
            if message.stop_reason == "max_tokens":
                reason = "the answer was cut at its token limit"
            tail = f" ({reason})" if reason else ""
            if reason is None and retried:
                tail = f" (after {retried} {'retry' if retried == 1 else 'retries'})"
            raise _RunFailed(
                AttemptError(
                    kind="fatal",
                    message=f"the answer does not match the output schema {schema.name!r}: "
                    f"{problem}{tail}",
                    code="output_invalid",
                )
            )
        state.corrections += 1
        sent = correction(problem)
        state.append(sent)
        await emit(MessageCompleted(sent))
        return True

    # --- attempts ------------------------------------------------------------------------

    def _request(self, context: Context, plan: RunPlan) -> ProviderRequest:
        if open_batch(context.messages) is not None:
            # the one exit to a provider: no call ever leaves without its result (docs/tools.md)
            raise _RunFailed(
                AttemptError(kind="internal", message="a tool call of the context has no result")
            )
        view = view_of(context, self.provider.name)  # O(appended) on a remembered context
        wire = self._wire
        settings = plan.settings
        return ProviderRequest(
            system_prompt=context.system_prompt,
            messages=view.messages,
            tools=plan.tools,
            model=settings.model or self.config.model,
            max_output_tokens=settings.max_output_tokens or self.config.max_output_tokens,
            temperature=settings.temperature,
            output_schema=settings.output_schema,
            estimated_input_tokens=heuristic_text_tokens(context.system_prompt) + view.tokens,
            encoded=None if wire is None else view.encoded(wire),
        )

    async def _answer(self, state: _State, emit: _Emitter) -> AssistantMessage:
        """One replayable assistant message, after any overflow retries; else _RunFailed."""
        overflow_retries = 0
        while True:
            try:
                message = await self._stream(self._request(state.context, state.plan), emit, state)
            except ProviderError as exc:
                if exc.kind == "overflow" and overflow_retries < self.config.max_overflow_retries:
                    overflow_retries += 1
                    await self._compact(state, emit, "overflow", keep_last=True)
                    continue
                raise _RunFailed(_error(exc)) from None
            return message

    async def _stream(
        self, request: ProviderRequest, emit: _Emitter, state: _State | None
    ) -> AssistantMessage:
        """Stream one attempt with retries; record attempts in ``state`` when given.

        Retryable errors are retried up to ``max_retries`` times, whether or not the attempt
        streamed content (docs/decisions.md); an attempt that did is recorded before its retry,
        one that streamed nothing is not. The final failure is recorded and raised.
        """
        policy = self.config.retry
        retries = 0
        while True:
            builder = AttemptBuilder(provider=self.provider.name, model=self.config.model)
            delay: float | None = None
            # one span per provider request (each retry is one), the backoff outside it
            with telemetry.chat_span(
                self.provider.name, request.model or self.config.model, request.messages
            ) as attempt_span:
                try:
                    async for event in self.provider.stream(request):
                        builder.feed(event)
                        if state is not None:
                            await emit(Delta(event))
                    if not builder.complete:
                        raise ProviderError("retryable", "the stream ended before the message did")
                except ProviderError as exc:
                    will_retry = exc.kind == "retryable" and retries < policy.max_retries
                    if not will_retry and retries:
                        exc.message = (
                            f"{exc.message} "
                            f"(after {retries} {'retry' if retries == 1 else 'retries'})"
                        )
                    failed = builder.failed(_error(exc))
                    telemetry.record_response(attempt_span, failed)
                    if state is not None and (builder.has_content or not will_retry):
                        await self._record(state, emit, failed)
                    if not will_retry:
                        raise
                    retries += 1
                    delay = policy.delay(retries, exc.retry_after)
                except asyncio.CancelledError:
                    cancelled = builder.failed(CANCELLED)
                    telemetry.record_response(attempt_span, cancelled)
                    if state is not None:
                        await _shielded(self._record(state, emit, cancelled))
                    raise
                else:
                    message = builder.message()
                    telemetry.record_response(attempt_span, message)
            if delay is not None:
                await asyncio.sleep(delay)
                continue
            if state is not None:
                message = await self._record(state, emit, message)
            return message

    async def _record(
        self, state: _State, emit: _Emitter, message: AssistantMessage
    ) -> AssistantMessage:
        """Record an attempt; the attempt as recorded (its calls naming their servers)."""
        message = state.attempt(message)
        await emit(MessageCompleted(message))
        return message


def _near(state: _State, incoming: tuple[AnyMessage, ...] = ()) -> bool:
    """The context (with ``incoming`` appended) is past ``compact_at`` of its bounds."""
    if state.bounds is None or state.size is None:
        return False
    return state.bounds.near(state.size.extend(incoming))


def _check_bounds(state: _State, incoming: tuple[AnyMessage, ...] = ()) -> None:
    """Fail the run (``context_too_large``) when its context, with ``incoming`` appended,
    would pass a bound: before the provider is sent what could not be stored."""
    if state.bounds is None or state.size is None:
        return
    passed = state.bounds.passed(state.size.extend(incoming))
    if passed is not None:
        raise _RunFailed(too_large(passed_reason(passed)))
