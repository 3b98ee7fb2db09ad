"""The checks of app/store/integrity.py on their own: a text against its checksum, a text
without one by decoding, and texts the database joined, cut apart by their byte lengths."""

from __future__ import annotations

import pytest

from app.agent.codec import dumps_message
from app.store.errors import StoredDataDamaged
from app.store.integrity import body_sha256, damage, verify_joined, verify_rows

from .builders import assistant, user

TEXTS = [dumps_message(user('é ✓ \U0001f600, [quoted] "x"')), dumps_message(assistant("two"))]


def spans(texts: list[str], digests: list[str | None] | None = None) -> str:
    digests = digests if digests is not None else [body_sha256(t) for t in texts]
    return ",".join(f"{len(t.encode())}:{d or ''}" for t, d in zip(texts, digests, strict=True))


def test_a_text_is_sound_when_it_matches_its_checksum_or_decodes_without_one() -> None:
    text = TEXTS[0]
    assert damage(text, body_sha256(text)) is None
    assert damage(text.encode(), body_sha256(text)) is None
    assert damage(text, None) is None
    changed = text.replace("quoted", "quotes")
    assert "checksum" in str(damage(changed, body_sha256(text)))
    assert "does not decode" in str(damage(text[:-2], None))
    assert "does not decode" in str(damage('{"type":"nope"}', None))


def test_joined_texts_are_checked_each_and_the_first_damaged_one_is_named() -> None:
    joined = ",".join(TEXTS).encode()
    verify_joined("c", "e", joined, spans(TEXTS))
    verify_joined("c", "e", b"", "")
    verify_joined("c", "e", joined, spans(TEXTS, [None, None]))  # decoded instead

    bad = [TEXTS[0], TEXTS[1].replace("two", "twp")]
    with pytest.raises(StoredDataDamaged) as caught:
        verify_joined("c", "e", ",".join(bad).encode(), spans(TEXTS))
    assert caught.value.message_index == 1 and caught.value.etag == "e"
    with pytest.raises(StoredDataDamaged) as caught:  # the lengths say more than was read
        verify_joined("c", "e", joined[:-5], spans(TEXTS))
    assert caught.value.message_index == 1
    with pytest.raises(StoredDataDamaged):  # bytes left over
        verify_joined("c", "e", joined + b",{}", spans(TEXTS))


def test_rows_are_checked_in_order() -> None:
    verify_rows("c", "e", TEXTS, [body_sha256(t) for t in TEXTS])
    with pytest.raises(StoredDataDamaged) as caught:
        verify_rows("c", "e", TEXTS, [body_sha256(TEXTS[0]), body_sha256(TEXTS[0])])
    assert caught.value.message_index == 1 and caught.value.conversation_id == "c"
