"""Client tools and approvals at the agent level (issue 12, docs/tools.md): a run pauses with
``requires_action`` when the model calls a client tool or an approval-gated tool, and the next
run answers every pending call before anything else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agent import (
    Agent,
    AgentConfig,
    Approval,
    AssistantMessage,
    ClientTool,
    Context,
    Input,
    InvalidTools,
    PendingCall,
    Result,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultMessage,
    ToolResultsRequired,
    UnexpectedAnswer,
    UserMessage,
    pending_calls,
    validate_context,
    validate_storable,
)
from app.agent.codec import dumps_context, loads_context
from app.agent.compaction import choose_cut
from app.agent.events import RunEvent, ToolStarted
from app.agent.pending import plan_resume, split_prompts
from app.agent.providers.base import ProviderError, ProviderRequest, StreamEvent
from app.agent.providers.echo import EchoProvider
from app.agent.replay import validate_messages
from app.agent.tools import Tool, ToolRegistry

from .scripted import HANG, Calls, ScriptedProvider, Step
from .test_run_failures import NO_WAIT, history

LOOKUP = ClientTool(
    name="lookup",
    description="Look a word up in the application's dictionary.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)
PICK = ClientTool(name="pick", parameters={"type": "object"})


class World:
    """Server tools with observable effects: ``add`` (ungated) and ``transfer``."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

        async def add(a: int, b: int) -> int:
            self.effects.append(f"add {a} {b}")
            return a + b

        async def transfer(amount: int) -> str:
            await self.release.wait()
            self.effects.append(f"transfer {amount}")
            return f"sent {amount}"

        self.registry = ToolRegistry(
            tools={"add": Tool.from_function(add), "transfer": Tool.from_function(transfer)}
        )


def agent_for(provider: Any, world: World | None = None, **kw: Any) -> Agent:
    tools = (world or World()).registry
    return Agent(AgentConfig(provider=provider, tools=tools, retry=NO_WAIT, **kw))


def result_for(call_id: str, text: str, name: str = "lookup") -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name=name, content=(TextBlock(text=text),))


def stored(result: Result) -> Context:
    """What the store does between runs (and across a restart): JSON out, JSON in."""
    validate_storable(result.context)
    return loads_context(dumps_context(result.context))


def assert_no_unanswered_call_was_sent(provider: ScriptedProvider) -> None:
    for request in provider.requests:
        validate_messages(request.messages)


def tool_names(request: ProviderRequest) -> list[str]:
    return [t.name for t in request.tools]


MIXED = Calls(
    (
        ("s1", "add", '{"a": 2, "b": 3}'),
        ("c1", "lookup", '{"word":  "carry"}'),
        ("a1", "transfer", '{"amount": 5}'),
    )
)


async def paused_mixed(world: World, *script: Any) -> tuple[Agent, ScriptedProvider, Result]:
    """A run whose batch has one server call, one client call and one approval call."""
    provider = ScriptedProvider(script=[MIXED, *script])
    agent = agent_for(provider, world, approval_required=frozenset({"transfer"}))
    result = await agent.run(
        Input(context=Context(), prompts=(UserMessage.text("go"),), client_tools=(LOOKUP,))
    )
    return agent, provider, result


# --- the loop -----------------------------------------------------------------------------


async def test_echo_client_tool_loop_pause_then_results_then_an_answer_quoting_the_result() -> None:
    agent = Agent(AgentConfig(provider=EchoProvider(), retry=NO_WAIT))
    raw = '{"word":"carry",  "x": [1,'  # not even valid JSON: kept verbatim
    paused = await agent.run(
        Input(
            context=Context(),
            prompts=(UserMessage.text(f"/tool lookup {raw}"),),
            client_tools=(LOOKUP,),
        )
    )

    assert paused.status == "requires_action"
    assert paused.required_action is not None
    (call,) = paused.required_action.tool_calls
    assert call == PendingCall(id=call.id, name="lookup", arguments=raw, kind="client")
    assert [m.type for m in paused.context.messages] == ["user", "assistant"]
    assert paused.final is not None and paused.final.tool_calls[0].id == call.id
    context = stored(paused)
    assert agent.pending_calls(context) == (call,)

    answered = await agent.run(
        Input(context=context, tool_results=(result_for(call.id, "to keep going"),))
    )

    assert answered.status == "completed" and answered.required_action is None
    assert answered.final is not None
    assert answered.final.content == (TextBlock(text='Tool lookup returned: "to keep going"'),)
    assert [m.type for m in answered.new_messages] == ["tool_result", "assistant"]
    validate_context(answered.context)


async def test_client_tools_are_offered_with_the_server_tools_for_that_run_only() -> None:
    provider = ScriptedProvider(script=["first", "second"])
    agent = agent_for(provider)
    await agent.run(
        Input(context=Context(), prompts=(UserMessage.text("a"),), client_tools=(LOOKUP, PICK))
    )
    await agent.run(Input(context=Context(), prompts=(UserMessage.text("b"),)))

    with_client, without = provider.requests
    assert tool_names(with_client) == ["add", "transfer", "lookup", "pick"]
    assert with_client.tools[2].parameters == LOOKUP.parameters
    assert with_client.tools[2].description == LOOKUP.description
    assert tool_names(without) == ["add", "transfer"]


async def test_mixed_batch_runs_the_server_call_and_pauses_for_the_client_and_approval_calls() -> (
    None
):
    world = World()
    agent, provider, paused = await paused_mixed(world, "all done")

    assert paused.status == "requires_action"
    assert world.effects == ["add 2 3"]  # the gated transfer did not run
    assert paused.required_action is not None
    assert [(c.id, c.kind, c.arguments) for c in paused.required_action.tool_calls] == [
        ("c1", "client", '{"word":  "carry"}'),
        ("a1", "approval", '{"amount": 5}'),
    ]
    # the context ends with the assistant message and the result of the call that ran
    assert [m.type for m in paused.context.messages] == ["user", "assistant", "tool_result"]
    assert paused.context.messages[2] == result_for("s1", "5", name="add")

    answered = await agent.run(
        Input(
            context=stored(paused),
            approvals=(Approval(tool_call_id="a1", approve=True),),
            tool_results=(result_for("c1", "to bring along"),),
        )
    )

    assert answered.status == "completed", answered.error
    assert world.effects == ["add 2 3", "transfer 5"]  # approved: it ran in this run
    answers = answered.context.messages[3:5]
    assert answers == (result_for("c1", "to bring along"), result_for("a1", "sent 5", "transfer"))
    assert answered.final is not None and answered.final.content == (TextBlock(text="all done"),)
    # the model saw every result of the batch
    assert provider.requests[-1].messages[-3:] == answered.context.messages[2:5]
    assert_no_unanswered_call_was_sent(provider)


async def test_approval_per_run_and_a_denial_becomes_an_error_result_carrying_the_reason() -> None:
    world = World()
    provider = ScriptedProvider(script=[Calls((("a1", "transfer", '{"amount": 9}'),)), "ok"])
    agent = agent_for(provider, world)
    paused = await agent.run(
        Input(
            context=Context(),
            prompts=(UserMessage.text("pay"),),
            require_approval=("transfer",),
        )
    )
    assert paused.status == "requires_action"
    assert paused.required_action is not None
    assert paused.required_action.tool_calls[0].kind == "approval"

    denied = await agent.run(
        Input(
            context=stored(paused),
            approvals=(Approval(tool_call_id="a1", approve=False, reason="over the limit"),),
            prompts=(UserMessage.text("then do not"),),
        )
    )

    assert denied.status == "completed"
    assert world.effects == []
    denial, prompt = denied.new_messages[:2]
    assert isinstance(denial, ToolResultMessage)
    assert denial.is_error and denial.tool_call_id == "a1" and denial.tool_name == "transfer"
    assert "over the limit" in denial.content[0].text  # type: ignore[union-attr]
    assert prompt == UserMessage.text("then do not")  # prompts after the results are optional
    assert provider.requests[-1].messages[-2:] == (denial, prompt)


async def test_an_approved_call_is_a_normal_server_call_and_a_gated_call_can_be_asked_again() -> (
    None
):
    world = World()
    script: list[Step] = [
        Calls((("a1", "transfer", '{"amount": 1}'),)),
        Calls((("a2", "transfer", "{}"),)),
    ]
    provider = ScriptedProvider(script=script)
    agent = agent_for(provider, world, approval_required=frozenset({"transfer"}))
    paused = await agent.run(Input(context=Context(), prompts=(UserMessage.text("pay"),)))

    again = await agent.run(
        Input(context=stored(paused), approvals=(Approval(tool_call_id="a1", approve=True),))
    )

    # the model called the gated tool again: the run pauses again, for the new call
    assert again.status == "requires_action"
    assert again.required_action is not None
    assert [c.id for c in again.required_action.tool_calls] == ["a2"]
    assert world.effects == ["transfer 1"]


async def test_a_call_to_an_unknown_tool_is_not_held_it_gets_an_error_result() -> None:
    provider = ScriptedProvider(script=[Calls((("u1", "nope", "{}"),)), "sorry"])
    result = await agent_for(provider).run(
        Input(context=Context(), prompts=(UserMessage.text("x"),), client_tools=(LOOKUP,))
    )
    assert result.status == "completed"
    error = result.new_messages[2]
    assert isinstance(error, ToolResultMessage) and error.is_error


# --- call order -----------------------------------------------------------------------------


THREE = Calls((("c1", "lookup", "1"), ("c2", "pick", "2"), ("a3", "transfer", "3")))


async def paused_three(world: World) -> tuple[Agent, Result]:
    agent = agent_for(ScriptedProvider(script=[THREE, "done"]), world)
    paused = await agent.run(
        Input(
            context=Context(),
            prompts=(UserMessage.text("go"),),
            client_tools=(LOOKUP, PICK),
            require_approval=("transfer",),
        )
    )
    assert paused.status == "requires_action"
    return agent, paused


async def test_results_given_out_of_order_are_stored_in_call_order() -> None:
    world = World()
    agent, paused = await paused_three(world)
    answered = await agent.run(
        Input(
            context=paused.context,
            tool_results=(result_for("c2", "two", "pick"), result_for("c1", "one")),
            approvals=(Approval(tool_call_id="a3", approve=False),),
        )
    )
    ids = [m.tool_call_id for m in answered.context.messages if isinstance(m, ToolResultMessage)]
    assert ids == ["c1", "c2", "a3"]


@given(st.permutations(["c1", "c2", "a3"]), st.booleans())
def test_any_order_of_answers_is_stored_in_call_order(order: list[str], approve: bool) -> None:
    async def main() -> list[str]:
        agent, paused = await paused_three(World())
        results = {"c1": result_for("c1", "one"), "c2": result_for("c2", "two", "pick")}
        answered = await agent.run(
            Input(
                context=paused.context,
                tool_results=tuple(results[i] for i in order if i in results),
                approvals=(Approval(tool_call_id="a3", approve=approve),),
            )
        )
        assert answered.status == "completed"
        return [m.tool_call_id for m in answered.new_messages if isinstance(m, ToolResultMessage)]

    assert asyncio.run(main()) == ["c1", "c2", "a3"]


# --- refusals ---------------------------------------------------------------------------------


async def test_refusal_a_pending_call_left_unanswered_raises_tool_results_required() -> None:
    world = World()
    agent, provider, paused = await paused_mixed(world)
    sent = len(provider.requests)

    with pytest.raises(ToolResultsRequired) as refused:
        await agent.run(
            Input(
                context=paused.context,
                prompts=(UserMessage.text("what now?"),),
                tool_results=(result_for("c1", "x"),),
            )
        )

    assert [c.id for c in refused.value.pending] == ["c1", "a1"]
    assert [c.id for c in refused.value.unanswered] == ["a1"]
    assert len(provider.requests) == sent  # nothing ran
    with pytest.raises(ToolResultsRequired):  # nor with nothing at all
        agent.check(Input(context=paused.context))


@pytest.mark.parametrize(
    ("results", "approvals", "call_id", "words"),
    [
        ([result_for("zz", "x")], [Approval(tool_call_id="a1", approve=True)], "zz", "not pending"),
        (
            [result_for("c1", "x"), result_for("c1", "y")],
            [Approval(tool_call_id="a1", approve=True)],
            "c1",
            "twice",
        ),
        (
            [result_for("c1", "x")],
            [Approval(tool_call_id="a1", approve=True), Approval(tool_call_id="a1", approve=False)],
            "a1",
            "twice",
        ),
        (
            [result_for("c1", "x"), result_for("a1", "y", "transfer")],
            [],
            "a1",
            "approval decision",
        ),
        ([], [Approval(tool_call_id="c1", approve=True)], "c1", "tool_result"),
        ([result_for("c1", "x", name="pick")], [], "c1", "names tool 'pick'"),
        ([result_for("s1", "x", name="add")], [], "s1", "not pending"),  # already answered
    ],
)
async def test_refusal_an_answer_that_does_not_fit_a_pending_call_names_the_call(
    results: list[ToolResultMessage], approvals: list[Approval], call_id: str, words: str
) -> None:
    _, _, paused = await paused_mixed(World())
    agent = agent_for(ScriptedProvider(script=[]), approval_required=frozenset({"transfer"}))

    with pytest.raises(UnexpectedAnswer) as refused:
        await agent.run(
            Input(context=paused.context, tool_results=tuple(results), approvals=tuple(approvals))
        )

    assert refused.value.tool_call_id == call_id
    assert words in str(refused.value)


@pytest.mark.parametrize(
    "answers",
    [
        {"tool_results": (result_for("c1", "x"),)},
        {"approvals": (Approval(tool_call_id="a1", approve=True),)},
    ],
)
async def test_refusal_answers_when_nothing_is_pending(answers: dict[str, Any]) -> None:
    provider = ScriptedProvider(script=[])
    with pytest.raises(UnexpectedAnswer, match="nothing is pending"):
        await agent_for(provider).run(Input(context=history(1), **answers))
    assert provider.requests == []


@pytest.mark.parametrize(
    ("tools", "require", "field", "words"),
    [
        ([ClientTool(name="add", parameters={"type": "object"})], [], "tools[0].name", "server"),
        ([LOOKUP, PICK, LOOKUP], [], "tools[2].name", "two client tools"),
        (
            [ClientTool(name="x", parameters={"type": "string"})],
            [],
            "tools[0].parameters",
            "object",
        ),
        ([ClientTool(name="x", parameters={})], [], "tools[0].parameters", "object"),
        (
            [ClientTool(name="x", parameters={"type": "object", "properties": []})],
            [],
            "tools[0].parameters.properties",
            "object",
        ),
        ([ClientTool(name="no spaces", parameters={"type": "object"})], [], "tools[0].name", "^"),
        ([ClientTool(name="x" * 65, parameters={"type": "object"})], [], "tools[0].name", "^"),
        ([ClientTool(name="", parameters={"type": "object"})], [], "tools[0].name", "^"),
        ([], ["add", "tansfer"], "require_approval[1]", "not a server tool"),
        ([LOOKUP], ["lookup"], "require_approval[0]", "not a server tool"),
    ],
)
async def test_refusal_invalid_client_tools_or_approval_names(
    tools: list[ClientTool], require: list[str], field: str, words: str
) -> None:
    provider = ScriptedProvider(script=[])
    with pytest.raises(InvalidTools) as refused:
        await agent_for(provider).run(
            Input(
                context=Context(),
                prompts=(UserMessage.text("x"),),
                client_tools=tuple(tools),
                require_approval=tuple(require),
            )
        )
    assert refused.value.field == field
    assert words in refused.value.reason
    assert provider.requests == []


def test_names_of_64_characters_from_the_allowed_set_are_accepted() -> None:
    tool = ClientTool(name="A-z_0" + "9" * 59, parameters={"type": "object"})
    agent = agent_for(ScriptedProvider(script=[]))
    plan = agent.check(Input(context=Context(), client_tools=(tool,)))
    assert tool.name in plan.holds


def test_the_agents_approval_required_must_name_its_server_tools() -> None:
    with pytest.raises(InvalidTools, match=r"approval_required\[0\].*'nope'"):
        agent_for(ScriptedProvider(script=[]), approval_required=frozenset({"nope"}))


# --- pending calls, storable and replayable -------------------------------------------------


def batch(*calls: tuple[str, str], answered: tuple[str, ...] = ()) -> Context:
    owner = AssistantMessage(
        content=tuple(ToolCallBlock(id=i, name=n, arguments="{}") for i, n in calls),
        provider="scripted",
        stop_reason="tool_use",
    )
    names = dict(calls)
    results = tuple(result_for(i, "r", names[i]) for i in answered)
    return Context(messages=(UserMessage.text("q"), owner, *results))


def test_pending_calls_are_the_unanswered_calls_of_the_last_batch_kind_by_name() -> None:
    context = batch(("x", "lookup"), ("y", "add"), ("z", "transfer"), answered=("y",))
    pending = pending_calls(context, {"add", "transfer"})
    assert [(c.id, c.kind) for c in pending] == [("x", "client"), ("z", "approval")]
    assert pending_calls(batch(("x", "lookup"), answered=("x",)), {"add"}) == ()
    assert pending_calls(history(2), {"add"}) == ()


def test_a_context_with_pending_calls_is_storable_but_not_replayable() -> None:
    context = batch(("x", "lookup"), ("y", "add"), answered=("y",))
    validate_storable(context)
    with pytest.raises(ValueError, match="never answered"):
        validate_context(context)
    # only the last batch may be pending
    earlier = Context(messages=(*context.messages, UserMessage.text("next")))
    with pytest.raises(ValueError, match="not answered"):
        validate_storable(earlier)


@st.composite
def paused_batches(draw: st.DrawFn) -> tuple[Context, list[ToolResultMessage], list[Approval]]:
    """A batch of client, approval and already-answered server calls, and answers to some of
    the pending ones, in a random order."""
    kinds = draw(st.lists(st.sampled_from(["lookup", "transfer", "add"]), min_size=1, max_size=6))
    calls = [(f"id{i}", name) for i, name in enumerate(kinds)]
    answered = tuple(i for i, name in calls if name == "add")
    context = batch(*calls, answered=answered)
    pending = [(i, name) for i, name in calls if name != "add"]
    chosen = draw(st.lists(st.sampled_from(pending), unique=True)) if pending else []
    results = [result_for(i, "r") for i, name in chosen if name == "lookup"]
    approvals = [
        Approval(tool_call_id=i, approve=draw(st.booleans()))
        for i, name in chosen
        if name == "transfer"
    ]
    return context, results, approvals


@given(paused_batches())
def test_plan_resume_answers_every_pending_call_in_call_order_or_refuses(
    case: tuple[Context, list[ToolResultMessage], list[Approval]],
) -> None:
    context, results, approvals = case
    server = {"add", "transfer"}
    pending = [c.id for c in pending_calls(context, server)]
    given_ids = {r.tool_call_id for r in results} | {a.tool_call_id for a in approvals}
    try:
        resume = plan_resume(context, results, approvals, server)
    except ToolResultsRequired as refused:
        assert [c.id for c in refused.unanswered] == [i for i in pending if i not in given_ids]
        assert refused.unanswered
        return
    if not pending:
        assert resume is None
        return
    assert resume is not None
    assert list(resume.answers) == pending  # call order, whatever order the answers came in
    for call_id, answer in resume.answers.items():
        if isinstance(answer, ToolCallBlock):
            assert answer.id == call_id and any(
                a.tool_call_id == call_id and a.approve for a in approvals
            )
        else:
            assert answer.tool_call_id == call_id


def test_plan_resume_refuses_nothing_and_returns_none_without_pending_calls() -> None:
    assert plan_resume(history(1), (), (), {"add"}) is None


def test_split_prompts_takes_the_leading_tool_results() -> None:
    r1, r2 = result_for("a", "1"), result_for("b", "2")
    prompt = UserMessage.text("hi")
    assert split_prompts([r1, r2, prompt]) == ((r1, r2), (prompt,))
    assert split_prompts([prompt]) == ((), (prompt,))
    assert split_prompts([r1]) == ((r1,), ())
    with pytest.raises(UnexpectedAnswer, match="before the prompts"):
        split_prompts([prompt, r1])


async def test_a_paused_context_survives_a_restart_through_json() -> None:
    _, _, paused = await paused_mixed(World())
    restarted = stored(paused)
    fresh = agent_for(ScriptedProvider(script=[]), approval_required=frozenset({"transfer"}))
    assert paused.required_action is not None
    assert fresh.pending_calls(restarted) == paused.required_action.tool_calls


async def test_switching_provider_keeps_calls_and_results_paired() -> None:
    owner = AssistantMessage(
        content=(
            ThinkingBlock(thinking="plan", signature="sig"),
            ToolCallBlock(id="toolu_1", name="lookup", arguments='{"word":"x"}'),
        ),
        provider="anthropic",
        stop_reason="tool_use",
        provider_data={"opaque": 1},
    )
    context = Context(messages=(UserMessage.text("q"), owner))
    provider = ScriptedProvider(script=["fine"])
    agent = agent_for(provider)
    assert [c.kind for c in agent.pending_calls(context)] == ["client"]

    result = await agent.run(Input(context=context, tool_results=(result_for("toolu_1", "r"),)))

    assert result.status == "completed"
    sent = provider.requests[0].messages
    validate_messages(sent)
    replayed = sent[1]
    assert isinstance(replayed, AssistantMessage)
    assert replayed.content == (owner.content[1],) and replayed.provider_data == {}
    assert result.context.messages[1] == owner  # the stored context keeps what was issued


# --- compaction -----------------------------------------------------------------------------


def long_paused_context() -> Context:
    """A long tool loop of one turn, paused on a client call with long arguments: the only
    cuts are right after the user message, before the pending call, and after it."""
    loop = (
        UserMessage.text("do it " + "x" * 400),
        AssistantMessage(
            content=(ToolCallBlock(id="s1", name="add", arguments='{"a":1,"b":2}'),),
            provider="scripted",
            stop_reason="tool_use",
        ),
        result_for("s1", "y" * 400, name="add"),
        AssistantMessage(
            content=(ToolCallBlock(id="p1", name="lookup", arguments="z" * 800),),
            provider="scripted",
            stop_reason="tool_use",
        ),
    )
    return Context(system_prompt="You are concise.", messages=loop)


def test_choose_cut_never_folds_a_pending_call() -> None:
    context = long_paused_context()
    owner = len(context.messages) - 1
    for reason in ("threshold", "overflow", "manual"):
        for keep_last in (True, False):
            for keep_tokens in (0, 160, 10_000):
                cut = choose_cut(context, reason, keep_tokens=keep_tokens, keep_last=keep_last)  # type: ignore[arg-type]
                assert cut is not None and cut <= owner


async def test_manual_compaction_keeps_the_pending_call_pending() -> None:
    context = long_paused_context()
    agent = agent_for(ScriptedProvider(script=[]))
    compacted = await agent.compact(context)

    assert compacted.status == "completed" and compacted.compactions
    assert compacted.context.summary
    assert compacted.context.messages[-1] == context.messages[-1]
    assert compacted.required_action is not None
    assert [c.id for c in compacted.required_action.tool_calls] == ["p1"]


async def test_a_threshold_compaction_before_the_answers_folds_only_what_precedes_them() -> None:
    context = long_paused_context()
    provider = ScriptedProvider(script=["answered"])
    agent = agent_for(provider, context_window=400, compact_at=0.5)

    result = await agent.run(Input(context=context, tool_results=(result_for("p1", "r"),)))

    assert result.status == "completed", result.error
    assert result.compactions and result.compactions[0].reason == "threshold"
    folded_calls = [
        c.id
        for m in result.compactions[0].folded
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls
    ]
    assert folded_calls == ["s1"]  # the answered call may go, the pending one stays
    assert result.context.messages[0] == context.messages[-1]
    kinds = [m.type for m in result.context.messages]
    assert kinds[-3:] == ["assistant", "tool_result", "assistant"]
    assert_no_unanswered_call_was_sent(provider)


# --- cancelled and failed resumes -------------------------------------------------------------


class HangingSummaries(ScriptedProvider):
    """Summary requests wait forever (a compaction the run is cancelled in)."""

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        if request.purpose == "summary":
            self.streaming.set()
            await asyncio.Event().wait()
        async for event in super().stream(request):
            yield event


async def test_a_resume_cancelled_before_the_answers_are_admitted_keeps_the_calls_pending() -> None:
    context = long_paused_context()
    provider = HangingSummaries(script=[])
    agent = agent_for(provider, context_window=400, compact_at=0.5)
    task = asyncio.create_task(
        agent.run(Input(context=context, tool_results=(result_for("p1", "r"),)))
    )
    await asyncio.wait_for(provider.streaming.wait(), 5)
    task.cancel()
    result = await asyncio.wait_for(task, 5)

    assert result.status == "cancelled"
    assert result.context == context
    assert result.required_action is not None
    assert [c.id for c in result.required_action.tool_calls] == ["p1"]
    assert provider.requests == []


async def test_a_resume_cancelled_while_the_model_answers_keeps_the_answers() -> None:
    world = World()
    agent, provider, paused = await paused_mixed(world, HANG)
    task = asyncio.create_task(
        agent.run(
            Input(
                context=paused.context,
                tool_results=(result_for("c1", "x"),),
                approvals=(Approval(tool_call_id="a1", approve=False),),
            )
        )
    )
    await asyncio.wait_for(provider.streaming.wait(), 5)
    task.cancel()
    result = await asyncio.wait_for(task, 5)

    assert result.status == "cancelled" and result.required_action is None
    validate_context(result.context)  # answered: the next run needs no answers
    assert [m.type for m in result.context.messages][-3:] == ["tool_result"] * 3
    assert_no_unanswered_call_was_sent(provider)


async def test_a_resume_cancelled_while_an_approved_call_runs_closes_it_as_interrupted() -> None:
    world = World()
    agent, _, paused = await paused_mixed(world)
    world.release.clear()
    started = asyncio.Event()

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, ToolStarted):
            started.set()

    task = asyncio.create_task(
        agent.run(
            Input(
                context=paused.context,
                tool_results=(result_for("c1", "x"),),
                approvals=(Approval(tool_call_id="a1", approve=True),),
            ),
            on_event=on_event,
        )
    )
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0)
    task.cancel()
    result = await asyncio.wait_for(task, 5)

    assert result.status == "cancelled" and result.required_action is None
    client, closed = result.context.messages[-2:]
    assert client == result_for("c1", "x")
    assert isinstance(closed, ToolResultMessage) and closed.tool_call_id == "a1"
    assert closed.is_error and "interrupted" in closed.content[0].text  # type: ignore[union-attr]
    assert world.effects == ["add 2 3"]


async def test_a_run_cancelled_in_a_mixed_batch_closes_its_server_call_and_keeps_the_rest() -> None:
    world = World()

    async def slow_add(a: int, b: int) -> int:
        await asyncio.Event().wait()
        return a + b

    world.registry.tools["add"] = Tool.from_function(slow_add, name="add")
    provider = ScriptedProvider(script=[MIXED])
    agent = agent_for(provider, world, approval_required=frozenset({"transfer"}))
    started = asyncio.Event()

    async def on_event(event: RunEvent) -> None:
        if isinstance(event, ToolStarted):
            started.set()

    task = asyncio.create_task(
        agent.run(
            Input(context=Context(), prompts=(UserMessage.text("go"),), client_tools=(LOOKUP,)),
            on_event=on_event,
        )
    )
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0)
    task.cancel()
    result = await asyncio.wait_for(task, 5)

    assert result.status == "cancelled"
    closed = result.context.messages[-1]
    assert isinstance(closed, ToolResultMessage) and closed.tool_call_id == "s1" and closed.is_error
    assert result.required_action is not None
    assert [(c.id, c.kind) for c in result.required_action.tool_calls] == [
        ("c1", "client"),
        ("a1", "approval"),
    ]


async def test_a_failed_resume_keeps_the_answers_and_stays_replayable() -> None:
    world = World()
    agent, _, paused = await paused_mixed(world, ProviderError("fatal", "gone"))
    result = await agent.run(
        Input(
            context=paused.context,
            tool_results=(result_for("c1", "x"),),
            approvals=(Approval(tool_call_id="a1", approve=True),),
        )
    )
    assert result.status == "failed" and result.required_action is None
    validate_context(result.context)
    assert world.effects == ["add 2 3", "transfer 5"]
