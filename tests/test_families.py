"""Model families' chat templates (grpolab.model.families), checked against the released templates that TRL 1.16
ships (read from the installed package, never kept here): Qwen3's is recognised and, not being append-only,
replaced for multi-turn training by grpolab's own, which renders every generation prompt of every conversation
the original renders with the same token ids (the one exception, past reasoning, is asserted exactly); Qwen2.5's
and Llama 3.1/3.2's are append-only and stay; a user's own append-only template wins, an edited one is never
replaced."""

from __future__ import annotations

import copy
from importlib.resources import files

import pytest

from grpolab.model.families import FAMILIES, QWEN3_TRAINING, digest, recognise, template_for_turns
from grpolab.model.template import append_only_problem, set_template_kwargs, template_kwargs

pytest.importorskip("trl", reason="TRL (the test extra) ships the released templates these tests compare with")
TEMPLATES = files("trl") / "chat_templates"
LLAMA = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
WRITTEN_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def released(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def with_template(tok, text: str):
    tok = copy.deepcopy(tok)
    tok.chat_template = text
    return tok


CONVERSATIONS = {
    "tool loop, reasoning in the turns": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "<think>\nI should add.\n</think>\n\n" + WRITTEN_CALL},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "<think>\nThe tool says 5.\n</think>\n\n2 + 3 = 5."},
    ],
    "system, parsed tool calls, two results in a row": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3, twice."},
        {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "Both 5.", "tool_calls": [CALL]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5", "reasoning_content": "Three times 5."},
    ],
    "feedback turns, no reasoning": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": WRITTEN_CALL},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "Not right. Try again."},
        {"role": "assistant", "content": " 5 \n"},
        {"role": "user", "content": "Yes."},
    ],
    "a stray end of reasoning": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "</think>Hello"},
        {"role": "tool", "content": "x"},
    ],
}


def prompts_of(conversation: list[dict]):
    """Every generation prompt of a conversation: each prefix that does not end with the assistant's turn."""
    return [conversation[:k] for k in range(1, len(conversation) + 1) if conversation[k - 1]["role"] != "assistant"]


def ids(tok, messages, template, tools, **kw):
    out = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, chat_template=template, **kw
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
def test_qwen3_training_template_renders_every_prompt_as_the_original(tiny_tokenizer, name, tools):
    """Turn by turn: each generation prompt of a tool conversation (with and without system, parsed and written
    tool calls, results in a row, reasoning in the text or as reasoning_content) has the same token ids under
    grpolab's template as under Qwen3's own, as long as no reasoning precedes the last user message."""
    original = released("qwen3")
    for messages in prompts_of(CONVERSATIONS[name]):
        assert ids(tiny_tokenizer, messages, QWEN3_TRAINING, tools) == ids(tiny_tokenizer, messages, original, tools)


def test_qwen3_training_template_keeps_past_reasoning(tiny_tokenizer):
    """The one difference: after a later user message Qwen3's own template drops a turn's reasoning (which is
    what makes it rewrite earlier turns); grpolab's keeps it, the tokens the model wrote and still reads. The
    rest of the rendering is the original's, character for character."""
    turn = "<think>\nLet me see.\n</think>\n\n5"
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": turn},
        {"role": "user", "content": "Sure?"},
    ]
    kw = {"add_generation_prompt": True, "tokenize": False}
    ours = tiny_tokenizer.apply_chat_template(messages, chat_template=QWEN3_TRAINING, **kw)
    theirs = tiny_tokenizer.apply_chat_template(messages, chat_template=released("qwen3"), **kw)
    assert theirs.replace("<|im_start|>assistant\n5", "<|im_start|>assistant\n" + turn) == ours != theirs


def test_qwen3_without_thinking_every_turn_follows_the_empty_block(tiny_tokenizer):
    """enable_thinking=false: the generation prompt writes an empty reasoning block, the model's turn follows
    it, and every turn renders so (append-only); the first prompt is the original's."""
    tok = with_template(tiny_tokenizer, QWEN3_TRAINING)
    set_template_kwargs(tok, {"enable_thinking": False})
    assert append_only_problem(tok) is None and append_only_problem(tok, TOOLS, "Be brief.") is None
    first = [{"role": "user", "content": "Hi"}]
    kw = {"enable_thinking": False}
    assert ids(tok, first, QWEN3_TRAINING, TOOLS, **kw) == ids(tok, first, released("qwen3"), TOOLS, **kw)
    text = tok.apply_chat_template([*first, {"role": "assistant", "content": "5"}], tokenize=False, **kw)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n5<|im_end|>\n")


@pytest.mark.parametrize(
    "name,family,replaced",
    [("qwen3", "Qwen3", True), ("qwen2_5", "Qwen2.5", False), ("llama3_1", "Llama 3.1", False)]
    + [("llama3_2", "Llama 3.2", False)],
)
def test_released_templates_are_recognised_and_only_qwen3s_is_replaced(tiny_tokenizer, name, family, replaced):
    """Recognised by the released text (surrounding whitespace aside); Qwen3's fails the probe and is replaced
    for training, said in a note; Qwen2.5's and Llama's pass it and are used as they are."""
    text = released(name)
    assert recognise(text).name == family == recognise("\n" + text.strip() + "\n\n").name
    tok = copy.deepcopy(tiny_tokenizer)
    if name.startswith("llama"):
        tok.add_special_tokens({"additional_special_tokens": list(LLAMA)})
        tok.eos_token = "<|eot_id|>"
    tok.chat_template = text
    own = append_only_problem(tok, TOOLS, "Be brief.")
    problem, note = template_for_turns(tok, TOOLS, "Be brief.")
    assert problem is None and tok.chat_template == text  # what checkpoints save stays the model's
    if replaced:
        assert "not append-only" in own and "Qwen3" in note and own in note
        assert template_kwargs(tok)["chat_template"] == QWEN3_TRAINING
        assert append_only_problem(tok, TOOLS, "Be brief.") is None
    else:
        assert own is None and note is None and "chat_template" not in template_kwargs(tok)


def test_the_users_own_template_wins_and_an_edited_one_is_not_replaced(tiny_tokenizer):
    """An append-only template the user chose (here TRL's own Qwen3 training template) is kept as it is; a
    Qwen3 template the user edited is not recognised, so the probe's refusal stands."""
    mine = with_template(tiny_tokenizer, released("qwen3_training"))
    assert template_for_turns(mine, TOOLS) == (None, None) and "chat_template" not in template_kwargs(mine)
    edited = with_template(tiny_tokenizer, "{#- mine -#}\n" + released("qwen3"))
    problem, note = template_for_turns(edited, TOOLS)
    assert "not append-only" in problem and note is None and recognise(edited.chat_template) is None


def test_the_bundled_template_and_the_digests():
    """SmolLM2's template is no family's; each family's digest is the SHA-256 of its released text."""
    bundled = files("grpolab") / "data" / "smollm2-tokenizer" / "chat_template.jinja"
    assert recognise(bundled.read_text()) is None
    assert recognise(None) is None and recognise({"default": released("qwen3")}).name == "Qwen3"
    names = {"Qwen3": "qwen3", "Qwen2.5": "qwen2_5", "Llama 3.1": "llama3_1", "Llama 3.2": "llama3_2"}
    assert {f.name: set(f.digests) for f in FAMILIES} == {k: {digest(released(v))} for k, v in names.items()}


# ----------------------------------------------------------------------------- Qwen2.5 and Llama 3.1/3.2

OWN_CALL = {
    "qwen2_5": WRITTEN_CALL,
    "llama3_1": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "llama3_2": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
}
"""How each family writes a call to add(a=2, b=3): Qwen2.5 in <tool_call> tags, Llama 3.x as the bare object."""


def family_tokenizer(tok, name: str):
    tok = with_template(tok, released(name))
    if name.startswith("llama"):
        tok.add_special_tokens({"additional_special_tokens": list(LLAMA)})
        tok.eos_token = "<|eot_id|>"
    return tok


@pytest.fixture(scope="module", params=sorted(OWN_CALL))
def append_only_family(request, tiny_tokenizer):
    return request.param, family_tokenizer(tiny_tokenizer, request.param)


def own_conversations(call: str) -> dict[str, list[dict]]:
    return {
        "tool loop, then feedback": [
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "2 + 3 = 5."},
            {"role": "user", "content": "Not right. Try again."},
            {"role": "assistant", "content": "5"},
        ],
        "two results in a row, two calls in turn": [
            {"role": "user", "content": "Add 2 and 3, twice."},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "5"},
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": '{"sum": 5}'},
            {"role": "assistant", "content": "Both 5."},
        ],
    }


@pytest.mark.parametrize("system", [None, "Be brief."], ids=["no system", "system"])
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
def test_qwen2_5_and_llama_own_templates_are_append_only_turn_by_turn(append_only_family, system, tools):
    """Qwen2.5's and Llama 3.1/3.2's released templates need no training template: with and without a system
    message and tools, the probe passes, and for tool conversations in each family's own call format (Qwen2.5's
    <tool_call> block, Llama's bare JSON, which grpolab.env.calls reads as the call) the text training builds
    (the first generation prompt, then each model turn, its end of turn and the template's addition_text) is
    the original's rendering of every prefix of the conversation, so the original renders them as it is."""
    from grpolab.env.calls import parse_tool_calls
    from grpolab.model.template import addition_text, render, turn_end

    name, tok = append_only_family
    assert append_only_problem(tok, tools, system) is None
    assert [(c.name, c.arguments) for c in parse_tool_calls(OWN_CALL[name])] == [("add", {"a": 2, "b": 3})]
    for label, conversation in own_conversations(OWN_CALL[name]).items():
        convo = ([{"role": "system", "content": system}] if system else []) + conversation
        turns = [i for i, m in enumerate(convo) if m["role"] == "assistant"]
        built = render(tok, convo[: turns[0]], add_generation_prompt=True, tools=tools)
        for a, nxt in zip(turns, turns[1:] + [None]):
            closed = render(tok, convo[: a + 1], add_generation_prompt=False, tools=tools)
            built += convo[a]["content"]
            assert closed[: turn_end(tok, convo[: a + 1], tools)] == built + tok.eos_token, (name, label, a)
            built += tok.eos_token
            if nxt is not None:
                built += addition_text(tok, convo[: a + 1], convo[a + 1 : nxt], tools)
                assert render(tok, convo[:nxt], add_generation_prompt=True, tools=tools) == built, (name, label, a)
