"""Chat templating: a prompt (a string or a list of messages) as the token ids of the model's chat
template, ready for the assistant turn; the check that it fits the model's context.
"""

from __future__ import annotations

import re

from grpolab.util.fields import ConfigError

_KWARGS_ATTR = "grpolab_template_kwargs"
_TRAINING_ATTR = "grpolab_training_template"


def set_template_kwargs(tokenizer, kwargs: dict | None) -> None:
    """Extra keyword arguments of `apply_chat_template` for every rendering of this tokenizer's template
    (the run's chat_template_kwargs, e.g. {"enable_thinking": False}): chat_prompts, render and
    everything built on them (multi-turn additions, evaluation, chat) pass them on."""
    setattr(tokenizer, _KWARGS_ATTR, dict(kwargs or {}))


def template_kwargs(tokenizer) -> dict:
    """The kwargs set_template_kwargs gave this tokenizer ({} when none), with `chat_template` when
    set_training_template gave it one."""
    kw = dict(getattr(tokenizer, _KWARGS_ATTR, None) or {})
    training = getattr(tokenizer, _TRAINING_ATTR, None)
    return {**kw, "chat_template": training} if training else kw


def set_training_template(tokenizer, text: str | None) -> None:
    """Render every conversation of this tokenizer with the template `text` (None: its own again), e.g. a
    family's append-only training template (grpolab.model.families); `tokenizer.chat_template`, which
    checkpoints save, stays the model's own."""
    setattr(tokenizer, _TRAINING_ATTR, text)


def chat_prompts(tokenizer, prompts: list, system_prompt: str | None, raw_strings: bool = False) -> list[list[int]]:
    """Token ids of each prompt wrapped in the model's chat template, ready for the assistant turn.

    A prompt is the user message (a string), or a list of chat messages ({"role", "content"}: system,
    user and assistant turns, as datasets give them); `system_prompt` goes first unless the list has
    its own system message. A bare tokenizer (no chat template) gets the text (the messages' contents
    joined by blank lines). raw_strings: a string prompt is the input text as it is, tokenised without
    the template (TRL's standard format: `tokenizer(text)["input_ids"]`)."""
    out = []
    for p in prompts:
        if isinstance(p, str) and raw_strings:
            out.append(list(tokenizer(p)["input_ids"]))
            continue
        if isinstance(p, str):
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": p}
            ]
            text = p
        else:
            msgs = [{"role": m["role"], "content": m["content"]} for m in p]
            if system_prompt and not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": system_prompt})
            text = "\n\n".join(m["content"] for m in msgs)
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=True, **template_kwargs(tokenizer)
            )
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


def context_length(model) -> int | None:
    """The model's context in tokens (its config's max_position_embeddings), None when it names none."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def check_prompt_lengths(ids: list[list[int]], examples: list, max_new_tokens: int, context: int | None) -> None:
    """ConfigError (exit 2), before anything is allocated for them, when a templated prompt (ids, one per
    example; the error names the example's id) plus max_new_tokens does not fit the model's `context`
    (None: no limit known). One 1 MB prompt (about 250 000 tokens) asked the prefill for terabytes at step 1; a prompt
    the model cannot read whole is a data error."""
    if context is None:
        return
    for e, x in zip(examples, ids):
        if len(x) + max_new_tokens > context:
            raise ConfigError(
                f"prompt of example {str(e.id)[:80]!r} has {len(x)} tokens in the chat template; with "
                f"max_new_tokens={max_new_tokens} that exceeds the model's context of {context} tokens "
                f"(max_position_embeddings): shorten or drop that row, or lower max_new_tokens"
            )


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

PROBE_EDGES = (
    lambda c: c,
    lambda c: c + " \n",  # a turn that ends in whitespace (templates that trim content drop it)
    lambda c: "\n " + c,  # one that starts with it
    lambda c: "</think>" + c,  # a stray end of reasoning (templates that split on it move the text before it)
    lambda c: "<think>\nLet me see.\n</think>\n\n" + c,  # reasoning written in the turn (templates may drop it later)
)
"""The probe is rendered once per edge, each applied to every assistant turn of PROBE: what models write
all the time, which a template may render differently from the plain turn."""

TURN_MARK = "GRPOLABTURNMARK7d1c4b"
"""Stands for the model's turn in a rendering that locates it: ASCII letters and digits, so that no
template trims, splits, escapes or drops it."""


class TemplateError(ValueError):
    """The chat template renders what follows a model's turn differently depending on what the turn says:
    the environment's tokens cannot be told from the model's for that turn."""


def append_only_problem(tokenizer, tools: list[dict] | None = None, system_prompt: str | None = None) -> str | None:
    """None if the template renders a conversation append-only, else why not (said before training).

    Renders a probe conversation (user, an assistant tool call, a tool result, assistant, user feedback,
    assistant) one message at a time, with and without the generation prompt, and checks that every
    rendering is a prefix of the next, and that `addition_text` (what training appends after each turn)
    is exactly the text by which the rendering grows. The probe runs once as it is and once for each of
    PROBE_EDGES (every assistant turn ending or starting in whitespace, with a stray `</think>`, with a
    reasoning block): a template that rewrites earlier turns (e.g. one that drops the reasoning of past
    assistant turns, or moves the system message) fails, and its trajectories' tokens would not be the
    tokens the model is trained on."""
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template: a multi-turn trajectory needs one to render tool results"
    for edge in PROBE_EDGES:
        probe = [{**m, "content": edge(m["content"])} if m["role"] == "assistant" else m for m in PROBE]
        problem = _probe_problem(tokenizer, probe, tools, system_prompt)
        if problem:
            return problem
    return None


def _probe_problem(tokenizer, probe: list[dict], tools: list[dict] | None, system_prompt: str | None) -> str | None:
    """append_only_problem for one probe conversation."""
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + probe
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    said = lambda a: f"assistant message {a + 1} ({msgs[a]['content'][:40]!r})"  # noqa: E731
    try:
        opened = render(tokenizer, msgs[: turns[0]], add_generation_prompt=True, tools=tools)
        for a, nxt in zip(turns, turns[1:] + [None]):
            closed = render(tokenizer, msgs[: a + 1], add_generation_prompt=False, tools=tools)
            if not closed.startswith(opened):
                return (
                    f"the assistant's turn ({said(a)}) changes the text rendered before it: "
                    f"the template is not append-only"
                )
            if nxt is None:
                break
            kept = closed[: turn_end(tokenizer, msgs[: a + 1], tools)]
            opened = render(tokenizer, msgs[:nxt], add_generation_prompt=True, tools=tools)
            if not opened.startswith(kept):
                return (
                    f"adding the {msgs[a + 1]['role']} message after {said(a)} rewrites "
                    f"the earlier turns: the template is not append-only"
                )
            rest, eos = opened[len(kept) :], tokenizer.eos_token or ""
            if eos and not kept.endswith(eos) and rest.startswith(eos):  # the end of turn opens the next message
                rest = rest[len(eos) :]
            if addition_text(tokenizer, msgs[: a + 1], msgs[a + 1 : nxt], tools) != rest:
                return (
                    f"the text the template adds after {said(a)} depends on what that turn says: "
                    f"the template is not append-only"
                )
    except TemplateError as e:
        return f"the chat template cannot be used for multi-turn training: {e}"
    except Exception as e:  # noqa: BLE001 (a template that cannot render a tool message, say)
        return f"the chat template cannot render a tool conversation: {type(e).__name__}: {e}"
    return None


def _after_turn(
    tokenizer, history: list[dict], added: list[dict], tools: list[dict] | None, add_generation_prompt: bool
) -> str:
    """The text the template renders after the model's turn (the last message of `history`) when `added`
    follows: located in a rendering where the turn's content is TURN_MARK, and checked against the
    rendering of the real turn, which must end with the same text (TemplateError if it does not). A
    template that trims the turn, or splits it at `</think>`, renders the turn itself differently from
    the text the model wrote; what follows it is the same."""
    real = render(tokenizer, history + added, add_generation_prompt=add_generation_prompt, tools=tools)
    stand_in = history[:-1] + [{**history[-1], "content": TURN_MARK}]
    marked = render(tokenizer, stand_in + added, add_generation_prompt=add_generation_prompt, tools=tools)
    if marked.count(TURN_MARK) != 1:
        raise TemplateError("the template does not render an assistant turn's text exactly once")
    after = marked[marked.index(TURN_MARK) + len(TURN_MARK) :]
    if not real.endswith(after):
        raise TemplateError(
            f"what the template renders after the model's turn {history[-1]['content'][:60]!r} "
            "depends on that turn's text"
        )
    return after


def turn_end(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> int:
    """Length of the text the model's own tokens cover in the rendering of `messages`, whose last message
    is the model's turn (content, then the template's end-of-turn text, e.g. `<|im_end|>`): everything
    after that point is the template's and is added as environment tokens.

    The turn is located by rendering (_after_turn), never by searching for its text: a template may render
    it trimmed, or split at `</think>`."""
    text = render(tokenizer, messages, add_generation_prompt=False, tools=tools)
    end = len(text) - len(_after_turn(tokenizer, messages, [], tools, False))
    eos = tokenizer.eos_token or ""
    if eos and text.startswith(eos, end):
        end += len(eos)
    return end


def addition_text(tokenizer, history: list[dict], added: list[dict], tools: list[dict] | None = None) -> str:
    """The text the template adds after the model's last turn (the last message of `history`, which ended
    with its end-of-turn token) when the environment's messages `added` follow, up to and including the
    next assistant header: the end of render(history + added, generation prompt) after the model's turn
    and its end-of-turn text (_after_turn). TemplateError if that text depends on what the turn says."""
    after = _after_turn(tokenizer, history, added, tools, True)
    eos = tokenizer.eos_token or ""
    return after[len(eos) :] if eos and after.startswith(eos) else after


def addition_ids(
    tokenizer, history: list[dict], added: list[dict], tools: list[dict] | None = None, events=None
) -> list[int]:
    """Token ids of `addition_text`: the template's special tokens (e.g. <|im_start|>) as their single ids,
    and the environment's text as plain text, always.

    A message's text that spells a special token (a tool printing `<|im_end|>`) must not become that
    token: it would end the environment's turn, or open a fake one, in the token stream the model is
    trained on. Such a text (a message's string, or the text of a part where the content is a list of
    parts, `[{"type": "text", "text": ...}]`) is tokenised on its own with the special tokens split into
    ordinary ones (`split_special_tokens`); the rest of the addition as the template renders it. Each
    string escaped counts one `special_tokens_escaped` event in `events` (a Counter) when given. A message
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
    """`added` with every string (but the role) that holds a special token's text replaced by a marker,
    inside lists and dicts too (content given as parts); and marker -> that string."""
    literal: dict[str, str] = {}

    def mark(v):
        if isinstance(v, str):
            if not _holds_special(v, specials):
                return v
            key = _MARK.format(len(literal))
            literal[key] = v
            return key
        if isinstance(v, list):
            return [mark(x) for x in v]
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        return v

    out = [{k: (v if k == "role" else mark(v)) for k, v in m.items()} for m in added]
    return out, literal


def _defanged(added: list[dict], specials: list[str]) -> list[dict]:
    """The fallback for a template that changes the text it renders: a zero-width space after the first
    character of every special token's text (`<\u200b|im_end|>`), which the tokenizer then reads as text;
    inside lists and dicts too."""

    def defang(v):
        if isinstance(v, list):
            return [defang(x) for x in v]
        if isinstance(v, dict):
            return {k: defang(x) for k, x in v.items()}
        if not isinstance(v, str):
            return v
        for sp in specials:
            v = v.replace(sp, sp[0] + "\u200b" + sp[1:])
        return v

    return [{k: (v if k == "role" else defang(v)) for k, v in m.items()} for m in added]


def _ids(tokenizer, text: str, split: bool = False) -> list[int]:
    kw = {"split_special_tokens": True} if split else {}
    return list(tokenizer(text, add_special_tokens=False, **kw)["input_ids"])
