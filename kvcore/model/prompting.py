"""Turn the user's text into prompt token ids exactly as `mlx_lm.generate` does.

When the tokenizer has a chat template (and the user has not turned it off) the text becomes a user message,
optionally after a system message, rendered with `add_generation_prompt=True` and encoded without special tokens
(the template writes its own); otherwise the raw text is encoded with the tokenizer's special tokens. Instruct
models answer nonsense to a raw prompt, so the template is on by default. The template's own tokens are prompt
positions like any other: they are cached, scored and compressed (a researcher wants to see what happens to them).
"""

from __future__ import annotations

from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` (mlx-lm's TokenizerWrapper or a Hugging Face tokenizer) has a chat template."""
    flag = getattr(tokenizer, "has_chat_template", None)
    return bool(flag) if flag is not None else getattr(tokenizer, "chat_template", None) is not None


def chat_messages(text: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The messages mlx-lm builds: an optional system message, then the text as the user's message."""
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": text})
    return messages


def render_chat(tokenizer: Any, text: str, system_prompt: str | None = None) -> str:
    """The chat template applied to `text` as `mlx_lm.generate` applies it (text, not ids)."""
    return tokenizer.apply_chat_template(
        chat_messages(text, system_prompt),
        tokenize=False,
        continue_final_message=False,
        add_generation_prompt=True,
    )


def encode_prompt(
    tokenizer: Any, text: str, chat_template: bool = True, system_prompt: str | None = None
) -> tuple[list[int], bool]:
    """Prompt ids for `text` and whether the chat template was applied (only if asked and the tokenizer has one).

    A system prompt without a template to put it in is refused rather than silently dropped.
    """
    use = chat_template and has_chat_template(tokenizer)
    if system_prompt is not None and not use:
        why = (
            "the chat template is off"
            if has_chat_template(tokenizer)
            else "this tokenizer has no chat template"
        )
        raise ValueError(
            f"a system prompt needs a chat template, but {why}: turn the chat template on or clear the system prompt"
        )
    if not use:
        return list(tokenizer.encode(text)), False
    return list(tokenizer.encode(render_chat(tokenizer, text, system_prompt), add_special_tokens=False)), True


#: Marks where the context ends inside a rendered chat message; no template writes it.
_QUESTION_MARK = "\x00kvlens-question\x00"


def split_chat(tokenizer: Any, context: str, system_prompt: str | None = None) -> tuple[str, str]:
    """(head, tail) of the chat template around one user message whose text is the context followed by a question:
    head + question + tail renders that message as `mlx_lm.generate` would, so the context (head) is prefilled and
    compressed alone and each question is fed as question + tail (kvpress's pipeline splits it the same way)."""
    rendered = render_chat(tokenizer, context + _QUESTION_MARK, system_prompt)
    head, mark, tail = rendered.partition(_QUESTION_MARK)
    if not mark:
        raise ValueError("the chat template rewrote the message text: run with --no-chat-template")
    return head, tail
