"""The compaction stage of :class:`~app.agent.run.Agent` (contract §4): choose a cut, ask the
provider for a summary, fold the history into it. The pure parts live in
:mod:`app.agent.compaction`; the CPU-heavy steps go to a worker thread through
:func:`~app.agent.offload.offload` once the context holds
:data:`~app.agent.offload.OFFLOAD_MESSAGES` messages."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app import telemetry

from . import compaction
from .events import CompactionCompleted
from .messages import AnyMessage, AssistantMessage, AttemptError, Context, Usage, text_of
from .offload import offload
from .opaque import prepare
from .providers.base import ProviderError, ProviderRequest, wire_of
from .records import Compaction, CompactionReason
from .sizes import ContextSize, SizeBounds
from .state import AgentConfig, _Emitter, _error, _RunFailed, _State
from .tokens import TokenTally, estimate_with


class _Folding:
    """Mixin of :class:`~app.agent.run.Agent`: compacting the context of a run."""

    config: AgentConfig

    if TYPE_CHECKING:

        async def _stream(
            self, request: ProviderRequest, emit: _Emitter, state: _State | None
        ) -> AssistantMessage: ...

    async def _compact(
        self,
        state: _State,
        emit: _Emitter,
        reason: CompactionReason,
        *,
        keep_last: bool,
        required: bool = True,
        incoming: tuple[AnyMessage, ...] = (),
    ) -> None:
        """Fold the history. ``required`` False: finding nothing to fold is not a failure (a
        compaction for size alone). ``incoming``: messages about to join the context (the
        fold makes room for them too)."""
        with telemetry.compaction_span(reason) as span:
            done = len(state.compactions)
            await self._fold_history(
                state, emit, reason, keep_last=keep_last, required=required, incoming=incoming
            )
            if len(state.compactions) > done:
                telemetry.record_compaction(span, state.compactions[-1])

    async def _fold_history(
        self,
        state: _State,
        emit: _Emitter,
        reason: CompactionReason,
        *,
        keep_last: bool,
        required: bool,
        incoming: tuple[AnyMessage, ...],
    ) -> None:
        cfg = self.config
        before = state.context
        at = len(state.new_messages)  # it happens before the next run message (Compaction.at)
        size = len(before.messages)
        cut = await offload(
            size,
            _cut,
            before,
            reason,
            keep_tokens=int(cfg.keep_after_compaction * cfg.context_window),
            keep_last=keep_last,
            bounds=state.bounds,
            now=state.size,
            incoming=incoming,
        )
        if cut is None:
            if reason == "manual" or not required:
                return  # nothing to fold: compacting now is a no-op, not an error
            raise _RunFailed(
                AttemptError(
                    kind="overflow" if reason == "overflow" else "fatal",
                    message="the context cannot be compacted further: nothing is left to fold",
                    code="nothing_to_compact",
                )
            )
        request = await offload(
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
        after, tally, after_size, record = await offload(
            size, _fold, before, state.tally, state.size, cut, summary, reason, at, answer.usage
        )
        # what the provider is sent of the compacted context, walked once here (off the loop
        # for a long one) rather than by the next request (app/agent/opaque.py)
        provider = self.config.provider
        await offload(len(after.messages), prepare, after, provider.name, wire_of(provider))
        state.context = after
        state.tally = tally
        state.size = after_size
        state.compactions.append(record)
        state.usage = state.usage + answer.usage
        await emit(CompactionCompleted(record))


def _cut(
    before: Context,
    reason: CompactionReason,
    *,
    keep_tokens: int,
    keep_last: bool,
    bounds: SizeBounds | None,
    now: ContextSize | None,
    incoming: tuple[AnyMessage, ...],
) -> int | None:
    """Where to cut: :func:`~app.agent.compaction.choose_cut`, folding at least what the
    size bounds need (:meth:`~app.agent.sizes.SizeBounds.fold_needed`) when they are given;
    ``now`` is the size of ``before``."""
    min_fold = 0
    if bounds is not None and now is not None:
        whole = (*before.messages, *incoming)
        min_fold = min(bounds.fold_needed(whole, now.extend(incoming)), len(before.messages))
    return compaction.choose_cut(
        before, reason, keep_tokens=keep_tokens, keep_last=keep_last, min_fold=min_fold
    )


def _fold(
    before: Context,
    tally: TokenTally,
    size: ContextSize | None,
    cut: int,
    summary: str,
    reason: CompactionReason,
    at: int,
    usage: Usage,
) -> tuple[Context, TokenTally, ContextSize | None, Compaction]:
    """The context, tally, size and record after folding ``before.messages[:cut]`` into
    ``summary``."""
    folded = before.messages[:cut]
    after = before.model_copy(update={"summary": summary, "messages": before.messages[cut:]})
    after_tally = tally.drop_prefix(folded)
    after_size = (
        None if size is None else size.drop_prefix(folded).with_texts(after.system_prompt, summary)
    )
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
    return after, after_tally, after_size, record
