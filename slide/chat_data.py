"""Chat SFT data: conversations rendered by the tokenizer's own chat template
(`apply_chat_template`), the loss on the assistant's turns only.

How the assistant's tokens are found: by rendering prefixes. For assistant message i the
template renders messages[:i] with the generation prompt (everything before the reply) and
messages[:i+1] (through the reply and its end-of-turn marker); both must be prefixes of the
whole conversation's text, and the characters between them are the reply's targets. The whole
text is then tokenized once, with character offsets, and a token is a target when it starts in
a reply. Characters, not token counts of the prefixes: a prefix tokenized alone can end in
another token than the same characters inside the whole text (a merge across the boundary).
Why not `return_assistant_tokens_mask`: it needs `{% generation %}` blocks in the template,
which few published templates have (Llama 3's, Qwen 2.5's and Mistral's do not); prefixes work
with any template that renders a conversation's start as the start of its text, and one that
does not is refused by name.

The template owns the format: no BOS or EOS is added around it (its end-of-turn marker is what
separates conversations in the token stream). A conversation longer than `LengthLimit.seq`
tokens is cut to its first `seq` tokens (`truncate`) or left out (`drop`), and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slide.data_formats import Chat
from slide.errors import DataError


@dataclass(frozen=True, slots=True)
class LengthLimit:
    """How conversations longer than a training sample are fit; part of the token cache's key."""

    seq: int
    truncation: str  # one of data_formats.TRUNCATION

    def key(self) -> str:
        return f"chat seq={self.seq} {self.truncation}"


@dataclass(slots=True)
class FitCounts:
    """Conversations tokenized, and those cut or left out for being longer than the limit."""

    conversations: int = 0
    truncated: int = 0
    dropped: int = 0


def encode_chats(
    tokenizer: Any, chats: list[Chat], limit: LengthLimit | None, counts: FitCounts
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The conversations' tokens in order, (ids int64, predict bool, starts int64: where each
    conversation begins); `counts` updated."""
    if not chats:
        return _no_tokens()
    _check_tokenizer(tokenizer, chats[0])
    rendered = [_render_replies(tokenizer, chat) for chat in chats]
    encoded = tokenizer([text for text, _ in rendered], add_special_tokens=False,
                        return_offsets_mapping=True, return_attention_mask=False)  # fmt: skip
    ids_parts, predict_parts = [], []
    for ids, offsets, (_, replies) in zip(
        encoded["input_ids"], encoded["offset_mapping"], rendered, strict=True
    ):
        counts.conversations += 1
        starts = np.array([a for a, _ in offsets], dtype=np.int64)
        predict = np.zeros(len(ids), dtype=np.bool_)
        for a, b in replies:
            predict |= (starts >= a) & (starts < b)
        if limit is not None and len(ids) > limit.seq:
            if limit.truncation == "drop":
                counts.dropped += 1
                continue
            counts.truncated += 1
            ids, predict = ids[: limit.seq], predict[: limit.seq]
        ids_parts.append(np.asarray(ids, dtype=np.int64))
        predict_parts.append(predict)
    if not ids_parts:
        return _no_tokens()
    starts = np.cumsum([0] + [len(p) for p in ids_parts[:-1]], dtype=np.int64)
    return np.concatenate(ids_parts), np.concatenate(predict_parts), starts


def _no_tokens() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.bool_), np.zeros(0, np.int64)


def fit_report(counts: FitCounts, limit: LengthLimit | None) -> str | None:
    """One line on the conversations the limit changed, or None where it changed none."""
    if limit is None or not (counts.truncated or counts.dropped):
        return None
    done = "truncated to" if limit.truncation == "truncate" else "dropped: longer than"
    changed = counts.truncated or counts.dropped
    return (f"data: {changed:,} of {counts.conversations:,} conversations {done} --seq "
            f"{limit.seq} tokens (--truncation {limit.truncation})")  # fmt: skip


def _check_tokenizer(tokenizer: Any, first: Chat) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{first.where}: chat data, but the tokenizer {tokenizer.name_or_path} "
                        "has no chat template (chat_template.jinja, or chat_template in "
                        "tokenizer_config.json): use a chat model's tokenizer")  # fmt: skip
    if not tokenizer.is_fast:
        raise DataError(f"{first.where}: chat data needs a fast tokenizer (tokenizer.json) for "
                        f"its character offsets; {tokenizer.name_or_path} is not one")  # fmt: skip


def _render_replies(tokenizer: Any, chat: Chat) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text and the character span of each assistant reply in it."""
    text = _render(tokenizer, chat, len(chat.messages), prompt=False)
    replies = []
    for i, turn in enumerate(chat.messages):
        if turn["role"] != "assistant":
            continue
        before = _render(tokenizer, chat, i, prompt=True)
        through = _render(tokenizer, chat, i + 1, prompt=False)
        if not (text.startswith(before) and text.startswith(through)):
            raise DataError(f"{chat.where}: the chat template does not render the conversation "
                            f"up to message {i + 1} as the start of its text, so the assistant's "
                            "tokens cannot be found (a template that rewrites earlier turns)")  # fmt: skip
        replies.append((len(before), len(through)))
    return text, replies


def _render(tokenizer: Any, chat: Chat, turns: int, *, prompt: bool) -> str:
    from jinja2 import TemplateError

    try:
        return str(tokenizer.apply_chat_template(list(chat.messages[:turns]), tokenize=False,
                                                 add_generation_prompt=prompt))  # fmt: skip
    except TemplateError as exc:
        raise DataError(f"{chat.where}: the tokenizer's chat template failed: {exc}") from None
