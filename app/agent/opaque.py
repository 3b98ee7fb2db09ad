"""What a provider is sent of the context: the summary projected as a user message, and the
opaque fields another provider issued dropped (contract §1).

:func:`for_provider` walks the messages; on a long conversation that walk, and counting what it
yields, would be most of a run's own cost. :func:`view_of` therefore remembers, per Context
object, the :class:`ProviderView` it built, and :func:`carry_over` derives the view of a context
with messages appended from the view of the context before, in O(appended). A run's context is
only ever extended by appending (``_State.append``) or replaced by a compaction (a new object,
so a new walk); the service's context cache keeps the Context a run returned, so the next run on
the same conversation starts from a remembered view and never walks the history again.

A view also carries the encodings of its messages in the wire formats of the providers that
sent it (:mod:`app.agent.providers.wire`), extended by :func:`carry_over` in O(appended) too, so
a real provider's request is built from bytes encoded once per message, not from the history
encoded again.

A view is remembered by the Context object's identity (through a weak reference, so it goes
when the Context does) and is only served when the messages tuple and summary it was built from
are still that Context's: the models are frozen, but a copy made with ``model_copy`` is a new
object and simply has no view yet.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from .compaction import project
from .messages import AnyMessage, AssistantMessage, Context, RedactedThinkingBlock, ThinkingBlock
from .providers.wire import Encoded, WireFormat
from .tokens import heuristic_tokens


def for_provider(messages: Sequence[AnyMessage], provider: str) -> tuple[AnyMessage, ...]:
    """Drop opaque fields another provider issued (contract §1); they would be refused.

    Only a message that holds something to strip (reasoning blocks, ``provider_data``) is
    copied; every other message is passed on as the same object, and a tuple with nothing to
    strip is given back as it is (no copy of a long context).
    """
    out: list[AnyMessage] = []
    changed = False
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
            changed = True
            if not content:
                continue  # nothing left to replay (it only held reasoning)
            message = message.model_copy(update={"content": content, "provider_data": {}})
        out.append(message)
    if not changed and isinstance(messages, tuple):
        return messages
    return tuple(out)


_OPAQUE = (ThinkingBlock, RedactedThinkingBlock)


@dataclass(frozen=True, slots=True)
class ProviderView:
    """What ``provider`` is sent of one context: ``messages`` (the projection through
    :func:`for_provider`) and ``tokens``, the heuristic of those messages
    (:func:`~app.agent.tokens.heuristic_tokens` summed). ``source`` and ``summary`` are what it
    was built from, to tell whether it still describes a Context. ``encodings``: ``messages``
    encoded in each wire format asked for so far (:meth:`encoded`), by the format's key."""

    provider: str
    source: tuple[AnyMessage, ...]
    summary: str
    messages: tuple[AnyMessage, ...]
    tokens: int
    encodings: dict[str, Encoded] = field(default_factory=dict)

    def encoded(self, wire: WireFormat) -> Encoded:
        """``messages`` in ``wire``'s format: remembered, or encoded (one walk) and remembered."""
        encoded = self.encodings.get(wire.key)
        if encoded is None:
            encoded = self.encodings[wire.key] = wire.encode(self.messages)
        return encoded

    @property
    def nbytes(self) -> int:
        """The bytes its encodings hold."""
        return sum(e.nbytes for e in self.encodings.values())

    def describes(self, context: Context, provider: str) -> bool:
        return (
            self.provider == provider
            and self.source is context.messages
            and self.summary == context.summary
        )


def view_of(context: Context, provider: str) -> ProviderView:
    """The view of ``context`` for ``provider``: remembered, or built (one walk) and remembered."""
    view = _remembered(context)
    if view is not None and view.describes(context, provider):
        return view
    messages = for_provider(project(context), provider)
    view = ProviderView(
        provider=provider,
        source=context.messages,
        summary=context.summary,
        messages=messages,
        tokens=sum(heuristic_tokens(m) for m in messages),
    )
    _remember(context, view)
    return view


def prepare(context: Context, provider: str, wire: WireFormat | None) -> ProviderView:
    """:func:`view_of`, with its messages encoded in ``wire``'s format too when the provider
    has one: the whole walk a request of ``context`` needs, done ahead (in a thread for a long
    context) so the request itself costs nothing more."""
    view = view_of(context, provider)
    if wire is not None:
        view.encoded(wire)
    return view


def is_prepared(context: Context, provider: str, wire: WireFormat | None) -> bool:
    """Whether :func:`prepare` would find everything remembered (O(1), no walk): a run on a
    context a run returned needs no worker thread for it, however long the context."""
    view = _remembered(context)
    return (
        view is not None
        and view.describes(context, provider)
        and (wire is None or wire.key in view.encodings)
    )


def carry_over(before: Context, after: Context, appended: Sequence[AnyMessage]) -> None:
    """``after`` is ``before`` with ``appended`` after its messages (same summary): give it the
    view ``before`` has, extended by ``appended`` in O(appended). Nothing when ``before`` has
    none."""
    view = _remembered(before)
    if view is None or not view.describes(before, view.provider):
        return
    if after.summary != before.summary or len(after.messages) != len(before.messages) + len(
        appended
    ):
        return  # not an append: the next request walks ``after`` once
    appended = tuple(appended)
    added = for_provider(appended, view.provider)
    if view.messages is before.messages and added is appended:
        messages = after.messages  # the view is the context itself: shared, not copied
    else:
        messages = view.messages + added
    _remember(
        after,
        ProviderView(
            provider=view.provider,
            source=after.messages,
            summary=after.summary,
            messages=messages,
            tokens=view.tokens + sum(heuristic_tokens(m) for m in added),
            encodings={key: e.extend(added) for key, e in view.encodings.items()},
        ),
    )


def held_bytes(context: Context) -> int:
    """The bytes the provider encodings remembered for ``context`` hold (0: none)."""
    view = _remembered(context)
    return 0 if view is None else view.nbytes


# id(Context) -> (a weak reference to it, its view); the reference's callback drops the entry
# when the Context is collected, before its id can be reused
_views: dict[int, tuple[weakref.ref[Context], ProviderView]] = {}


def _remembered(context: Context) -> ProviderView | None:
    entry = _views.get(id(context))
    if entry is None or entry[0]() is not context:
        return None
    return entry[1]


def _remember(context: Context, view: ProviderView) -> None:
    key = id(context)

    def forget(ref: weakref.ref[Context]) -> None:
        entry = _views.get(key)
        if entry is not None and entry[0] is ref:
            del _views[key]

    _views[key] = (weakref.ref(context, forget), view)
