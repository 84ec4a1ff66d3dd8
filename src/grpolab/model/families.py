"""Model families' chat templates for multi-turn training: which family a model's own template is, and the
template grpolab renders its conversations with.

    recognise(chat_template)     the Family whose released template this is (by its digest), else None
    template_for_turns(tok, ...) before training: the tokenizer's own template when it renders append-only,
                                 else its family's training template (set on the tokenizer, with a note
                                 for the run's line), else why neither can be used

Multi-turn training keeps the model's sampled tokens and appends the environment's, rendered by the chat
template (grpolab.model.template); that needs a template that only ever appends. Qwen2.5's and
Llama 3.1/3.2's own templates do, and are used as they are. Qwen3's does not: it renders the reasoning
block of an assistant turn only after the last user message, and an empty one only on the conversation's
last turn, so a turn renders differently once a tool result or a user message follows it. QWEN3_TRAINING
renders every turn as it will always be rendered: the reasoning written in it when there is some (after a
later user message too), and otherwise the turn as the original renders it in a prompt. It renders every
generation prompt the original renders the same, token for token, except that the reasoning of turns
before the last user message is kept (the tokens the model wrote, still in its context); with
enable_thinking=false every turn follows the empty reasoning block that the generation prompt wrote.

A family is recognised the way TRL recognises it (the exact text of the family's released template, here
its SHA-256, leading and trailing whitespace aside), so a template the user edited is never replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from grpolab.model.template import append_only_problem, set_training_template


@dataclass(frozen=True)
class Family:
    """A model family's chat template: its name, the digests of its released template (texts differing only
    in surrounding whitespace count as one), and grpolab's training template (None: the original is
    append-only and used as it is)."""

    name: str
    digests: frozenset[str]
    training: str | None = None


QWEN3_TRAINING = r"""{#- grpolab's append-only rendering of Qwen3 conversations (grpolab.model.families) -#}
{%- set no_think = enable_thinking is defined and enable_thinking is false -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' %}{{ messages[0].content + '\n\n' }}{% endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
    ~ 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools %}{{ '\n' ~ (tool | tojson) }}{% endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    ~ '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    ~ '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set text = m.content if m.content is string else '' -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if no_think -%}
{{- '<think>\n\n</think>\n\n' + text -}}
{%- else -%}
{%- set thought = m.reasoning_content if m.reasoning_content is string else '' -%}
{%- if m.reasoning_content is not string and '</think>' in text -%}
{%- set thought = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set text = text.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- if thought -%}
{{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + text.lstrip('\n') -}}
{%- else -%}
{{- text -}}
{%- endif -%}
{%- endif -%}
{%- for call in m.tool_calls or [] -%}
{%- set f = call.function if call.function else call -%}
{%- if not loop.first or text %}{{ '\n' }}{% endif -%}
{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": '
    + (f.arguments if f.arguments is string else f.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
{{- '\n<tool_response>\n' + text + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if no_think %}{{ '<think>\n\n</think>\n\n' }}{% endif -%}
{%- endif -%}
"""
"""Qwen3's conversations, append-only (module docstring): the original's system and tools header, user,
tool-response and tool-call rendering, and each assistant turn rendered the same wherever it stands."""


def digest(chat_template: str) -> str:
    """SHA-256 (hex) of a chat template's text without leading and trailing whitespace."""
    return hashlib.sha256(chat_template.strip().encode()).hexdigest()


FAMILIES = (
    Family("Qwen3", frozenset({"a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"}), QWEN3_TRAINING),
    Family("Qwen2.5", frozenset({"55b2f4a26ac9ee719330a61a0c39d9e538b0e9322212f048326318cff4f8674a"})),
    Family("Llama 3.1", frozenset({"93c0e9aa3629bbd77e68dbc0f5621f6e6b23aa8d74b932595cdb8d64684526d7"})),
    Family("Llama 3.2", frozenset({"d82792f95932f1c9cef5c4bd992f171225e3bf8c7b609b4557c9e1ec96be819f"})),
)
"""The families whose released template grpolab recognises (the Qwen3 models share one template, as do
the Qwen2.5 instruct models)."""


def recognise(chat_template) -> Family | None:
    """The family whose released template `chat_template` is (a dict of named templates: its `default`),
    else None."""
    if isinstance(chat_template, dict):
        chat_template = chat_template.get("default")
    if not isinstance(chat_template, str):
        return None
    d = digest(chat_template)
    return next((f for f in FAMILIES if d in f.digests), None)


def template_for_turns(
    tokenizer, tools: list[dict] | None = None, system_prompt: str | None = None
) -> tuple[str | None, str | None]:
    """(problem, note) before multi-turn training. The tokenizer's own template wins when it renders append-only
    (grpolab.model.template.append_only_problem): (None, None). Else, when it is a recognised family's released
    template with a training template, that template renders every conversation from now on
    (set_training_template): (None, the note for the run's line). Else (the probe's problem, None)."""
    problem = append_only_problem(tokenizer, tools, system_prompt)
    if problem is None:
        return None, None
    family = recognise(getattr(tokenizer, "chat_template", None))
    if family is None or family.training is None:
        return problem, None
    set_training_template(tokenizer, family.training)
    again = append_only_problem(tokenizer, tools, system_prompt)
    if again:  # cannot happen for the families above (tests/test_families.py); said if it ever does
        set_training_template(tokenizer, None)
        return f"{problem}; grpolab's {family.name} training template did not help either: {again}", None
    return None, (
        f"chat template: the model's is {family.name}'s, which is not append-only ({problem}); its conversations "
        f"are rendered by grpolab's {family.name} training template (grpolab.model.families), the same tokens "
        f"except that past reasoning is kept"
    )


__all__ = ["FAMILIES", "QWEN3_TRAINING", "Family", "digest", "recognise", "template_for_turns"]
