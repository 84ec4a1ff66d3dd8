"""Chat templating: a prompt (a string or a list of messages) as the token ids of the model's chat
template, ready for the assistant turn.
"""

from __future__ import annotations

import re

_KWARGS_ATTR = "grpolab_template_kwargs"


def set_template_kwargs(tokenizer, kwargs: dict | None) -> None:
    """Extra keyword arguments of `apply_chat_template` for every rendering of this tokenizer's template
    (the run's chat_template_kwargs, e.g. {"enable_thinking": False}): chat_prompts, render and
    everything built on them (multi-turn additions, evaluation, chat) pass them on."""
    setattr(tokenizer, _KWARGS_ATTR, dict(kwargs or {}))


def template_kwargs(tokenizer) -> dict:
    """The kwargs set_template_kwargs gave this tokenizer ({} when none)."""
    return dict(getattr(tokenizer, _KWARGS_ATTR, None) or {})


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
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                **template_kwargs(tokenizer))
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:  # a bare tokenizer: plain text prompt
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out




# ----------------------------------------------------------------------------- multi-turn conversations
#
# A multi-turn trajectory is one token stream. The model's turns are kept as the ids it sampled (never
# decoded and re-encoded); what the environment adds (tool results, feedback, the role headers around
# them and the next assistant header) is the chat template's own rendering of the added messages: the
# text by which the rendering of the conversation grows, tokenised. That is exact only for a template
# that renders conversations append-only (each turn's rendering a prefix of the next), which
# `append_only_problem` checks before training.


def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
    """The chat template's text of `messages` (tools: OpenAI function schemas, for templates that show them)."""
    kw = {**template_kwargs(tokenizer), **({"tools": tools} if tools else {})}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kw)


PROBE = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "Not right. Try again."},
    {"role": "assistant", "content": "5"},
]


def append_only_problem(tokenizer, tools: list[dict] | None = None, system_prompt: str | None = None) -> str | None:
    """None if the template renders a conversation append-only, else why not (said before training).

    Renders a probe conversation (user, an assistant tool call, a tool result, assistant, user feedback,
    assistant) one message at a time, with and without the generation prompt, and checks that every
    rendering is a prefix of the next. A template that rewrites earlier turns (e.g. one that drops the
    reasoning of past assistant turns, or moves the system message) fails, and its trajectories' tokens
    would not be the tokens the model is trained on."""
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template: a multi-turn trajectory needs one to render tool results"
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + PROBE
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    try:
        opened = render(tokenizer, msgs[:turns[0]], add_generation_prompt=True, tools=tools)
        for a, nxt in zip(turns, turns[1:] + [None]):
            closed = render(tokenizer, msgs[:a + 1], add_generation_prompt=False, tools=tools)
            if not closed.startswith(opened):
                return (f"the assistant's turn (message {a + 1}) changes the text rendered before it: "
                        f"the template is not append-only")
            if nxt is None:
                break
            kept = closed[:turn_end(tokenizer, msgs[:a + 1], tools)]
            opened = render(tokenizer, msgs[:nxt], add_generation_prompt=True, tools=tools)
            if not opened.startswith(kept):
                return (f"adding the {msgs[a + 1]['role']} message after assistant message {a + 1} rewrites "
                        f"the earlier turns: the template is not append-only")
    except Exception as e:  # noqa: BLE001 (a template that cannot render a tool message, say)
        return f"the chat template cannot render a tool conversation: {type(e).__name__}: {e}"
    return None


def turn_end(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Length of the text the model's own tokens cover in the rendering of `messages`, whose last message
    is the model's turn (content, then the template's end-of-turn text, e.g. `<|im_end|>`): everything
    after that point is the template's and is added as environment tokens."""
    text = render(tokenizer, messages, add_generation_prompt=False, tools=tools)
    content = messages[-1]["content"]
    end = text.rindex(content) + len(content) if content else len(render(tokenizer, messages[:-1], add_generation_prompt=True, tools=tools))
    eos = tokenizer.eos_token or ""
    if eos and text.startswith(eos, end):
        end += len(eos)
    return end


def addition_text(tokenizer, history: list[dict], added: list[dict], tools: list[dict] | None = None) -> str:
    """The text the template adds after the model's last turn (the last message of `history`, which ended
    with its end-of-turn token) when the environment's messages `added` follow, up to and including the
    next assistant header: render(history + added, generation prompt)[turn_end(history):]."""
    cut = turn_end(tokenizer, history, tools)
    return render(tokenizer, history + added, add_generation_prompt=True, tools=tools)[cut:]


def addition_ids(tokenizer, history: list[dict], added: list[dict], tools: list[dict] | None = None,
                 events=None) -> list[int]:
    """Token ids of `addition_text`: the template's special tokens (e.g. <|im_start|>) as their single ids,
    and the environment's text as plain text, always.

    A message's text that spells a special token (a tool printing `<|im_end|>`) must not become that
    token: it would end the environment's turn, or open a fake one, in the token stream the model is
    trained on. Such a text is tokenised on its own with the special tokens split into ordinary ones
    (`split_special_tokens`); the rest of the addition as the template renders it. Each message string
    escaped counts one `special_tokens_escaped` event in `events` (a Counter) when given. A message
    without a special token (nearly all) is tokenised exactly as before, in one piece."""
    specials = special_strings(tokenizer)
    marked, literal = _marked(added, specials)
    if not literal:
        return _ids(tokenizer, addition_text(tokenizer, history, added, tools))
    if events is not None:
        events["special_tokens_escaped"] += len(literal)
    text = addition_text(tokenizer, history, marked, tools)
    if any(text.count(mark) != 1 for mark in literal):  # the template did not render each text as it was
        return _ids(tokenizer, addition_text(tokenizer, history, _defanged(added, specials), tools))
    ids: list[int] = []
    for piece in re.split("(" + "|".join(map(re.escape, literal)) + ")", text):
        if piece in literal:
            ids += _ids(tokenizer, literal[piece], split=True)
        elif piece:
            ids += _ids(tokenizer, piece)
    return ids


def special_strings(tokenizer) -> list[str]:
    """The texts a tokenizer turns into its special tokens (`<|im_end|>`, ...), longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in added.values() if getattr(t, "special", False) and getattr(t, "content", "")}
    found = found or {t for t in getattr(tokenizer, "all_special_tokens", []) if t}
    return sorted(found, key=len, reverse=True)


def _holds_special(text: str, specials: list[str]) -> bool:
    """True if `text` contains one of `specials` (a first-character test skips most text in one pass)."""
    firsts = {sp[0] for sp in specials}
    return any(c in text for c in firsts) and any(sp in text for sp in specials)


_MARK = "\ue000grpolab-env-text-{}\ue001"  # private-use characters: no template or tokenizer gives them meaning


def _marked(added: list[dict], specials: list[str]) -> tuple[list[dict], dict[str, str]]:
    """`added` with every string (but the role) that holds a special token's text replaced by a marker;
    and marker -> that string."""
    literal: dict[str, str] = {}
    out = []
    for m in added:
        m2 = dict(m)
        for k, v in m.items():
            if k != "role" and isinstance(v, str) and _holds_special(v, specials):
                mark = _MARK.format(len(literal))
                literal[mark] = v
                m2[k] = mark
        out.append(m2)
    return out, literal


def _defanged(added: list[dict], specials: list[str]) -> list[dict]:
    """The fallback for a template that changes the text it renders: a zero-width space after the first
    character of every special token's text (`<\u200b|im_end|>`), which the tokenizer then reads as text."""
    def defang(v):
        if not isinstance(v, str):
            return v
        for sp in specials:
            v = v.replace(sp, sp[0] + "\u200b" + sp[1:])
        return v
    return [{k: (v if k == "role" else defang(v)) for k, v in m.items()} for m in added]


def _ids(tokenizer, text: str, split: bool = False) -> list[int]:
    kw = {"split_special_tokens": True} if split else {}
    return list(tokenizer(text, add_special_tokens=False, **kw)["input_ids"])
