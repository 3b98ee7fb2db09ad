"""The tool stages of :class:`~app.agent.run.Agent`: running a batch of server-tool calls,
admitting the answers to pending calls, and closing the calls a failed or cancelled run could
not finish (docs/tools.md)."""

from __future__ import annotations

from .events import MessageCompleted, ToolFinished, ToolStarted
from .messages import AssistantMessage, ToolCallBlock, ToolResultMessage
from .pending import Resume
from .replay import open_batch
from .state import AgentConfig, _Emitter, _shielded, _State
from .tools import interrupted_result, run_batch


class _ToolBatches:
    """Mixin of :class:`~app.agent.run.Agent`: the steps that run tools and record their results."""

    config: AgentConfig

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
                await run_batch(state.plan.runner or self.config.tools, approved, on_done)
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
            await run_batch(state.plan.runner or self.config.tools, calls, on_done)
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
