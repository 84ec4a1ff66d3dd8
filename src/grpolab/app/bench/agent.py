"""The multi-turn setting of `grpolab bench` (`--setting agent`): what both sides share for tool use.

One chat template (Qwen2.5's, on SmolLM2's <|im_start|>/<|im_end|> tokens, written into a copy of the model
directory that both load: `bench_model_dir`), one environment written once in TRL's `environment_factory` form
(`BenchCalculator`, whose tool `add` runs when the model writes a `<tool_call>`), the same few-shot prompts
(`AGENT_TASK_ARGS`), and limits that mean the same on both sides (`agent_limits`).
"""

from __future__ import annotations

from typing import Protocol


class Setting(Protocol):
    """What this module reads of a bench spec (grpolab.app.bench.spec.Spec)."""

    model: str
    agent: bool
    new_tokens: int
    max_turns: int


ENV_REPLY_TOKENS = 64
"""Environment tokens allowed per tool reply (the reply and the template's role headers around it: about 17
for a sum); with the limits of `agent_limits` no limit but the turn's and the turn count ever binds."""

# Qwen2.5's chat template, as TRL 1.16 ships it (trl/chat_templates/qwen2_5.jinja): it renders tools and tool
# calls (TRL's supports_tool_calling), appends only (TRL's is_chat_template_prefix_preserving and grpolab's
# append_only_problem), and TRL knows how to parse its tool calls (add_response_schema). SmolLM2 has the same
# <|im_start|>/<|im_end|> special tokens, so the bundled model reads it as its own format plus a tools section.
BENCH_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are '
    'provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == '
    '"assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


class BenchCalculator:
    """The agent setting's environment, written once in TRL's `environment_factory` form and given as is to
    both sides (grpolab: env.name=grpolab.app.bench.agent:BenchCalculator; TRL: environment_factory=BenchCalculator).
    Its one tool, `add`, runs when the model writes a `<tool_call>` for it; a turn without a call ends the
    trajectory. It owns no reward: both sides score with `bench_reward`."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, **kwargs) -> None:
        """A new trajectory: nothing to add to the prompt (the few-shot prompt is the task's)."""
        self.calls = 0

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The sum, as text.
        """
        self.calls += 1
        return str(int(a) + int(b))


ENV_NAME = "grpolab.app.bench.agent:BenchCalculator"


def _shot(a: int, b: int) -> str:
    """One solved example in the template's own rendering: the question, the assistant's call, the tool's reply,
    the assistant's answer, then the next user turn opens."""
    return (
        f"What is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        f'{{{{"name": "add", "arguments": {{{{"a": {a}, "b": {b}}}}}}}}}\n</tool_call><|im_end|>\n'
        f"<|im_start|>user\n<tool_response>\n{a + b}\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\nThe answer is {a + b}.<|im_end|>\n<|im_start|>user\n"
    )


# The bundled model writes no tool call when only shown the tools section; after two solved examples in the
# conversation it calls `add` in some of its first turns (docs/performance.md, "Multi-turn: tool use against
# TRL's environment_factory"). The examples are part of the user message's text, written in the template's
# rendering (special tokens included), so the prompt is token for token the rendering of a real two-shot tool
# conversation on both sides (tests/test_bench.py checks it).
AGENT_TASK_ARGS = {
    "digits": 2,
    "operators": "+",
    "system_prompt": "You are a helpful assistant.",
    "template": _shot(12, 30) + _shot(57, 16) + "What is {question}?",
}
FEWSHOT_EXAMPLES = ((12, 30), (57, 16))


def agent_limits(spec: Setting) -> dict:
    """The multi-turn limits of both sides, from --new-tokens (T, one turn) and --max-turns (K):

    grpolab  env.max_turn_tokens = T, env.max_turns = K, env.max_model_tokens = K T,
             env.max_env_tokens = (K - 1) ENV_REPLY_TOKENS
    TRL      generation_kwargs max_new_tokens = T (each generate call: one turn), max_tool_calling_iterations = K - 1,
             max_completion_length = K T + (K - 1) ENV_REPLY_TOKENS (TRL's budget counts the tool replies too)

    so a turn ends at EOS or T tokens on both, at most K turns, and neither total budget binds first."""
    T, K = spec.new_tokens, spec.max_turns
    env = max(1, (K - 1) * ENV_REPLY_TOKENS)
    return {
        "turn_tokens": T,
        "max_turns": K,
        "model_tokens": K * T,
        "env_tokens": env,
        "trl_max_new_tokens": T,
        "trl_tool_iterations": K - 1,
        "trl_max_completion_length": K * T + (K - 1) * ENV_REPLY_TOKENS,
    }


def bench_model_dir(spec: Setting, dest: str) -> str:
    """The model directory both sides load. The agent setting: a copy of spec.model's directory in `dest`
    (weights linked, not copied) whose chat template is BENCH_CHAT_TEMPLATE; otherwise spec.model's own."""
    import json
    import os
    from pathlib import Path

    from grpolab.model.load import model_dir

    src = Path(model_dir(spec.model, log=lambda *_: None))
    if not spec.agent:
        return str(src)
    out = Path(dest) / "bench-model"
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json") or not f.is_file():
            continue
        if not (out / f.name).exists():
            os.symlink(f.resolve(), out / f.name)
    cfg = json.loads((src / "tokenizer_config.json").read_text()) if (src / "tokenizer_config.json").exists() else {}
    cfg.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "chat_template.jinja").write_text(BENCH_CHAT_TEMPLATE)
    return str(out)
