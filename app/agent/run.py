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
fold — run in a worker thread (:func:`asyncio.to_thread`) once the context holds
:data:`OFFLOAD_MESSAGES` messages, so the event loop is never held for their duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from app import telemetry

from . import compaction
from .assembly import AttemptBuilder
from .events import (
    CompactionCompleted,
    Delta,
    EventSink,
    MessageCompleted,
    RunEvent,
    ToolFinished,
    ToolStarted,
)
from .messages import (
    AnyMessage,
    AssistantMessage,
    AttemptError,
    Context,
    RedactedThinkingBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    Usage,
    UserMessage,
    text_of,
)
from .pending import (
    PendingCall,
    RequiredAction,
    Resume,
    pending_calls,
    plan_resume,
    required_action,
    validate_approval_names,
    validate_client_tools,
)
from .providers.base import Provider, ProviderError, ProviderRequest, ToolSpec
from .records import Compaction, CompactionReason, Input, Result, RunStatus
from .replay import open_batch
from .retry import RetryPolicy
from .tokens import TokenTally, estimate_with, tally_of
from .tools import ToolRegistry, interrupted_result, run_batch


@dataclass(frozen=True)
class AgentConfig:
    """How an agent runs. One config (and one Agent) serves any number of contexts."""

    provider: Provider
    model: str = ""
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    context_window: int = 128_000
    compact_at: float = 0.8
    #: share of the window kept after a threshold compaction
    keep_after_compaction: float = 0.4
    max_turns: int = 32
    max_overflow_retries: int = 2
    max_output_tokens: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: server tools whose calls wait for the application's decision (docs/tools.md)
    approval_required: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        validate_approval_names(self.approval_required, self.tools.tools, field="approval_required")


@dataclass(frozen=True)
class RunPlan:
    """What :meth:`Agent.check` makes of an Input: the tools offered to the model, the names
    whose calls pause the run (client tools and approval-gated server tools), and how the
    context's pending calls are answered."""

    tools: tuple[ToolSpec, ...]
    holds: frozenset[str] = frozenset()
    resume: Resume | None = None


#: From this many messages on, the steps whose cost grows with the context run in a thread.
OFFLOAD_MESSAGES = 2_000

_P = ParamSpec("_P")
_T = TypeVar("_T")


async def _offload(size: int, fn: Callable[_P, _T], *args: _P.args, **kw: _P.kwargs) -> _T:
    """``fn(*args, **kw)``, in a worker thread when ``size`` (messages) makes it CPU-heavy."""
    if size >= OFFLOAD_MESSAGES:
        return await asyncio.to_thread(fn, *args, **kw)
    return fn(*args, **kw)


class _RunFailed(Exception):
    def __init__(self, error: AttemptError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class _State:
    """What one run has produced so far; turned into a Result however the run ends."""

    context: Context
    tally: TokenTally  # always the tally of context.messages
    new_messages: list[AnyMessage] = field(default_factory=list)
    final: AssistantMessage | None = None
    compactions: list[Compaction] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    admitted: bool = False
    plan: RunPlan = field(default_factory=lambda: RunPlan(tools=()))
    #: ids of the calls this run executes; on failure the unfinished ones are closed
    closable: set[str] = field(default_factory=set)

    def append(self, *messages: AnyMessage) -> None:
        """Messages that join both the continuation state and the run record."""
        self.context = self.context.model_copy(
            update={"messages": (*self.context.messages, *messages)}
        )
        self.tally = self.tally.extend(messages)
        self.new_messages.extend(messages)

    def attempt(self, message: AssistantMessage) -> None:
        """Every attempt is a run record; only a replayable one joins the context."""
        self.final = message
        self.usage = self.usage + message.usage
        if message.replayable:
            self.append(message)
            self.closable.update(c.id for c in message.tool_calls if c.name not in self.plan.holds)
        else:
            self.new_messages.append(message)

    def result(
        self,
        status: RunStatus,
        error: AttemptError | None = None,
        required: RequiredAction | None = None,
    ) -> Result:
        return Result(
            status=status,
            context=self.context,
            new_messages=tuple(self.new_messages),
            final=self.final,
            compactions=tuple(self.compactions),
            usage=self.usage,
            error=error,
            admitted=self.admitted,
            required_action=required,
        )


CANCELLED = AttemptError(kind="aborted", message="the run was cancelled")


class Agent:
    """Runs conversations. Keeps nothing between calls; safe to share across tasks."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    @property
    def provider(self) -> Provider:
        return self.config.provider

    async def run(self, input: Input, *, on_event: EventSink | None = None) -> Result:
        """Run on ``input.context`` plus ``input.prompts``; never mutates the input.

        Raises the refusals of :meth:`check` before anything runs; every other way a run can
        end is a Result.
        """
        plan = self.check(input)
        return await self._guarded(
            input.context, input.prompts, None, on_event, input.tokens, plan=plan
        )

    def check(self, input: Input) -> RunPlan:
        """Validate an input without running it (pure, cheap: O(the last tool batch)).

        Raises :class:`~app.agent.pending.InvalidTools` for bad client tools or approval
        names, :class:`~app.agent.pending.UnexpectedAnswer` for an answer to a call that is not
        pending (or a second one), :class:`~app.agent.pending.ToolResultsRequired` when a
        pending call is left unanswered.
        """
        server = self.config.tools.tools
        client = validate_client_tools(input.client_tools, server)
        gated = validate_approval_names(input.require_approval, server)
        resume = plan_resume(input.context, input.tool_results, input.approvals, server)
        specs = self.config.tools.specs
        return RunPlan(
            tools=(*specs, *(t.spec for t in client)) if client else specs,
            holds=frozenset(t.name for t in client) | gated | self.config.approval_required,
            resume=resume,
        )

    def pending_calls(self, context: Context) -> tuple[PendingCall, ...]:
        """The calls ``context`` is waiting on, with their kind (see :mod:`app.agent.pending`)."""
        return pending_calls(context, self.config.tools.tools)

    async def compact(
        self,
        context: Context,
        *,
        on_event: EventSink | None = None,
        tokens: TokenTally | None = None,
    ) -> Result:
        """Compact now (contract §4 ``POST …/compact``): fold all but the current turn.

        ``tokens``: the running tally of ``context.messages``, as in ``Input.tokens``."""
        return await self._guarded(context, (), "manual", on_event, tokens)

    async def _guarded(
        self,
        context: Context,
        prompts: tuple[UserMessage, ...],
        compact: CompactionReason | None,
        on_event: EventSink | None,
        tokens: TokenTally | None = None,
        *,
        plan: RunPlan | None = None,
    ) -> Result:
        emit = _Emitter(on_event)
        state = _State(
            context=context,
            tally=tokens or TokenTally(),
            plan=plan or RunPlan(tools=self.config.tools.specs),
        )
        try:
            if tokens is None:
                state.tally = await _offload(len(context.messages), tally_of, context.messages)
            if compact is not None:
                await self._compact(state, emit, compact, keep_last=True)
            else:
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
        pending = pending_calls(state.context, self.config.tools.tools)
        if status is None:
            status = "requires_action" if pending else "completed"
        return state.result(status, error, required_action(pending))

    async def _run(self, state: _State, prompts: tuple[UserMessage, ...], emit: _Emitter) -> None:
        cfg = self.config
        resume = state.plan.resume
        if prompts or resume is not None:
            ctx = state.context
            answers = () if resume is None else resume.results
            projected = estimate_with(
                state.tally.extend((*answers, *prompts)), ctx.system_prompt, ctx.summary
            )
            if projected > cfg.compact_at * cfg.context_window and ctx.messages:
                await self._compact(state, emit, "threshold", keep_last=False)
            if resume is not None:
                await self._answer_pending(state, emit, resume)
            state.append(*prompts)
            state.admitted = True
            for prompt in prompts:
                await emit(MessageCompleted(prompt))
        holds = state.plan.holds
        for _ in range(cfg.max_turns):
            message = await self._answer(state, emit)
            calls = message.tool_calls
            if not calls:
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

    async def _answer_pending(self, state: _State, emit: _Emitter, resume: Resume) -> None:
        """Admit the answers to the pending calls, in call order; approved calls run first.

        An approved call the run cannot finish (it is cancelled) is closed as interrupted, so
        the batch is fully answered either way.
        """
        approved = resume.approved
        state.closable.update(c.id for c in approved)
        done: dict[str, ToolResultMessage] = {}

        async def on_done(index: int, result: ToolResultMessage) -> None:
            done[result.tool_call_id] = result
            await emit(ToolFinished(result))

        try:
            for call in approved:
                await emit(ToolStarted(call))
            if approved:
                await run_batch(self.config.tools, approved, on_done)
        finally:
            answered = [
                answer
                if isinstance(answer, ToolResultMessage)
                else done[answer.id]
                if answer.id in done
                else interrupted_result(answer)
                for answer in resume.answers.values()
            ]
            state.append(*answered)
            state.admitted = True
            for result in answered:
                await _shielded(emit(MessageCompleted(result)))

    async def _close_unfinished(self, state: _State, emit: _Emitter) -> None:
        """Close the calls this run started (or was about to start) but did not finish.

        Pending calls — client calls, and approval calls not approved in this run — stay
        unanswered: the application answers them in the next run.
        """
        found = open_batch(state.context.messages)
        if found is None:
            return
        index, missing = found
        owner = state.context.messages[index]
        assert isinstance(owner, AssistantMessage)
        unfinished = set(missing) & state.closable
        closing = [interrupted_result(c) for c in owner.tool_calls if c.id in unfinished]
        state.append(*closing)
        for result in closing:
            await _shielded(emit(MessageCompleted(result)))

    # --- attempts ------------------------------------------------------------------------

    def _request(self, context: Context, tools: tuple[ToolSpec, ...]) -> ProviderRequest:
        if open_batch(context.messages) is not None:
            # the one exit to a provider: no call ever leaves without its result (docs/tools.md)
            raise _RunFailed(
                AttemptError(kind="internal", message="a tool call of the context has no result")
            )
        return ProviderRequest(
            system_prompt=context.system_prompt,
            messages=for_provider(compaction.project(context), self.provider.name),
            tools=tools,
            model=self.config.model,
            max_output_tokens=self.config.max_output_tokens,
        )

    async def _answer(self, state: _State, emit: _Emitter) -> AssistantMessage:
        """One replayable assistant message, after any overflow retries; else _RunFailed."""
        overflow_retries = 0
        while True:
            try:
                message = await self._stream(
                    self._request(state.context, state.plan.tools), emit, state
                )
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
                await self._record(state, emit, message)
            return message

    async def _record(self, state: _State, emit: _Emitter, message: AssistantMessage) -> None:
        state.attempt(message)
        await emit(MessageCompleted(message))

    # --- tools ---------------------------------------------------------------------------

    async def _tool_batch(
        self, state: _State, emit: _Emitter, calls: tuple[ToolCallBlock, ...]
    ) -> None:
        done: dict[int, ToolResultMessage] = {}

        async def on_done(index: int, result: ToolResultMessage) -> None:
            done[index] = result
            await emit(ToolFinished(result))

        for call in calls:
            await emit(ToolStarted(call))
        try:
            await run_batch(self.config.tools, calls, on_done)
        finally:
            # Results arrive in any order; they are recorded in call order. On cancellation the
            # finished ones stay (contract §3.4) and the unfinished ones are closed as interrupted,
            # so the context keeps no unanswered call but pending ones (docs/tools.md).
            finished = [
                interrupted_result(c) if done.get(i) is None else done[i]
                for i, c in enumerate(calls)
            ]
            state.append(*finished)
            for result in finished:
                await _shielded(emit(MessageCompleted(result)))

    # --- compaction ----------------------------------------------------------------------

    async def _compact(
        self, state: _State, emit: _Emitter, reason: CompactionReason, *, keep_last: bool
    ) -> None:
        with telemetry.compaction_span(reason) as span:
            done = len(state.compactions)
            await self._fold_history(state, emit, reason, keep_last=keep_last)
            if len(state.compactions) > done:
                telemetry.record_compaction(span, state.compactions[-1])

    async def _fold_history(
        self, state: _State, emit: _Emitter, reason: CompactionReason, *, keep_last: bool
    ) -> None:
        cfg = self.config
        before = state.context
        at = len(state.new_messages)  # it happens before the next run message (Compaction.at)
        size = len(before.messages)
        cut = await _offload(
            size,
            compaction.choose_cut,
            before,
            reason,
            keep_tokens=int(cfg.keep_after_compaction * cfg.context_window),
            keep_last=keep_last,
        )
        if cut is None:
            if reason == "manual":
                return  # nothing to fold: compacting now is a no-op, not an error
            raise _RunFailed(
                AttemptError(
                    kind="overflow" if reason == "overflow" else "fatal",
                    message="the context cannot be compacted further: nothing is left to fold",
                    code="nothing_to_compact",
                )
            )
        request = await _offload(
            cut, compaction.summary_request, before.summary, before.messages[:cut], model=cfg.model
        )
        try:
            answer = await self._stream(request, emit, None)
        except ProviderError as exc:
            raise _RunFailed(_error(exc, prefix="compaction failed: ")) from None
        # NUL cannot be stored in a PostgreSQL text column; a summary never needs one.
        summary = text_of(answer).replace("\x00", "").strip()
        if not summary:
            raise _RunFailed(
                AttemptError(
                    kind="fatal",
                    message="compaction failed: the provider wrote an empty summary",
                )
            )
        after, tally, record = await _offload(
            size, _fold, before, state.tally, cut, summary, reason, at, answer.usage
        )
        state.context = after
        state.tally = tally
        state.compactions.append(record)
        state.usage = state.usage + answer.usage
        await emit(CompactionCompleted(record))


def _fold(
    before: Context,
    tally: TokenTally,
    cut: int,
    summary: str,
    reason: CompactionReason,
    at: int,
    usage: Usage,
) -> tuple[Context, TokenTally, Compaction]:
    """The context, tally and record after folding ``before.messages[:cut]`` into ``summary``."""
    folded = before.messages[:cut]
    after = before.model_copy(update={"summary": summary, "messages": before.messages[cut:]})
    after_tally = tally.drop_prefix(folded)
    record = Compaction(
        reason=reason,
        folded=folded,
        previous_summary=before.summary,
        summary=summary,
        tokens_before=estimate_with(tally, before.system_prompt, before.summary),
        tokens_after=estimate_with(after_tally, after.system_prompt, after.summary),
        usage=usage,
        at=at,
    )
    return after, after_tally, record


def for_provider(messages: tuple[AnyMessage, ...], provider: str) -> tuple[AnyMessage, ...]:
    """Drop opaque fields another provider issued (contract §1); they would be refused.

    Only a message that holds something to strip (reasoning blocks, ``provider_data``) is
    copied; every other message is passed on as the same object.
    """
    out: list[AnyMessage] = []
    for message in messages:
        if (
            isinstance(message, AssistantMessage)
            and message.provider != provider
            and (
                message.provider_data
                or not message.content
                or any(isinstance(b, _OPAQUE) for b in message.content)
            )
        ):
            content = tuple(
                b
                for b in message.content
                if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)
            )
            if not content:
                continue  # nothing left to replay (it only held reasoning)
            message = message.model_copy(update={"content": content, "provider_data": {}})
        out.append(message)
    return tuple(out)


_OPAQUE = (ThinkingBlock, RedactedThinkingBlock)


def _error(exc: ProviderError, prefix: str = "") -> AttemptError:
    return AttemptError(
        kind=exc.kind, message=prefix + exc.message, status=exc.status, code=exc.code
    )


class _Emitter:
    """Delivers run events; a failing sink never fails the run."""

    def __init__(self, sink: EventSink | None) -> None:
        self._sink = sink

    async def __call__(self, event: RunEvent) -> None:
        if self._sink is None:
            return
        try:
            await self._sink(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken listener (e.g. a gone client) must not end the run
            self._sink = None


async def _shielded(awaitable: Awaitable[None]) -> None:
    """Finish a bookkeeping await while the run is being cancelled."""
    try:
        await awaitable
    except asyncio.CancelledError:
        pass
