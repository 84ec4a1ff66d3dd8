"""Chat templating: a prompt (a string or a list of messages) as the token ids of the model's chat
template, ready for the assistant turn.
"""

from __future__ import annotations


def chat_prompts(tokenizer, prompts: list, system_prompt: str | None) -> list[list[int]]:
    """Token ids of each prompt wrapped in the model's chat template, ready for the assistant turn.

    A prompt is the user message (a string), or a list of chat messages ({"role", "content"}: system,
    user and assistant turns, as datasets give them); `system_prompt` goes first unless the list has
    its own system message. A bare tokenizer (no chat template) gets the text (the messages' contents
    joined by blank lines)."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": p}]
            text = p
        else:
            msgs = [{"role": m["role"], "content": m["content"]} for m in p]
            if system_prompt and not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": system_prompt})
            text = "\n\n".join(m["content"] for m in msgs)
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:  # a bare tokenizer: plain text prompt
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out


