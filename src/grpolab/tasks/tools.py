"""The `tools` task: answer a question with exactly one call to a deterministic built-in tool.

Built in: procedurally generated questions for a calculator, unit conversion and date arithmetic
(grpolab.rewards.tools). The model answers with

    <tool_call>{"name": "calculator", "arguments": {"expression": "0.175 * 2340"}}</tool_call>

and the `tool_call` reward executes the call and compares the result with the expected one.

With `task_args: {path: tasks.jsonl}` items come from a local JSONL file, one object per line:

    {"prompt": str, "tools": [tool name | {"name", "description", "parameters": JSON schema}],
     "expected_tool": str?, "expected_result": any?, "expected_arguments": object?, "id": str?}

Tools given by name are the built-in ones. One of expected_result (needs a built-in tool, which is
executed) or expected_arguments (compared type-strictly) is required.

task_args: path (str), eval_size (int, default 50 built-in / 20% of a file).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from pathlib import Path

import jsonschema

from grpolab.batch import Example
from grpolab.rewards.tools import TOOL_FUNCTIONS, TOOL_SPECS, calculator, convert_units, date_add, date_diff, weekday
from grpolab.tasks._args import check_optional_count, check_optional_path, read_jsonl, split_held_out
from grpolab.util.fields import ConfigError

SYSTEM_PROMPT = (
    "You can call tools. To call one, reply with exactly one block\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "using strict JSON that matches the tool's parameters. Do not compute the answer yourself."
)

_UNIT_WORDS = {
    "km": "kilometers",
    "mi": "miles",
    "m": "meters",
    "ft": "feet",
    "cm": "centimeters",
    "in": "inches",
    "kg": "kilograms",
    "lb": "pounds",
    "g": "grams",
    "oz": "ounces",
    "l": "liters",
    "gal": "gallons",
    "h": "hours",
    "min": "minutes",
    "C": "degrees Celsius",
    "F": "degrees Fahrenheit",
    "K": "kelvin",
}
_UNIT_PAIRS = [
    ("km", "mi"),
    ("mi", "km"),
    ("m", "ft"),
    ("ft", "m"),
    ("cm", "in"),
    ("in", "cm"),
    ("kg", "lb"),
    ("lb", "kg"),
    ("g", "oz"),
    ("l", "gal"),
    ("gal", "l"),
    ("h", "min"),
    ("C", "F"),
    ("F", "C"),
    ("C", "K"),
]


def _tools_block(names: list[str]) -> str:
    return json.dumps([TOOL_SPECS[n] for n in names], indent=None)


def _prompt(question: str, names: list[str]) -> str:
    return (
        f"Available tools (JSON schema of each tool's arguments):\n{_tools_block(names)}\n\n"
        f"Question: {question}\nAnswer with one tool call."
    )


def _rand_date(rng: random.Random) -> str:
    return (dt.date(2000, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 40))).isoformat()


def generate(rng: random.Random) -> Example:
    """One built-in question with its expected tool and result."""
    kind = rng.choice(["calc_percent", "calc_total", "calc_avg", "units", "date_add", "date_diff", "weekday"])
    if kind == "calc_percent":
        p, x = rng.choice([5, 10, 12.5, 15, 17.5, 20, 25, 30, 45, 60, 75]), rng.randrange(20, 5000)
        q, tool, args = f"What is {p}% of {x}?", "calculator", {"expression": f"{p} / 100 * {x}"}
    elif kind == "calc_total":
        a, b, c = rng.randrange(2, 40), rng.randrange(100, 9999) / 100, rng.randrange(1, 30)
        q = f"I buy {a} items at ${b:.2f} each and pay ${c} for shipping. What is the total cost in dollars?"
        tool, args = "calculator", {"expression": f"{a} * {b:.2f} + {c}"}
    elif kind == "calc_avg":
        xs = [rng.randrange(1, 500) for _ in range(rng.randrange(3, 6))]
        q = f"What is the average of {', '.join(map(str, xs))}?"
        tool, args = "calculator", {"expression": f"({' + '.join(map(str, xs))}) / {len(xs)}"}
    elif kind == "units":
        a, b = rng.choice(_UNIT_PAIRS)
        v = rng.randrange(1, 2000) / rng.choice([1, 10])
        q = f"Convert {v:g} {_UNIT_WORDS[a]} to {_UNIT_WORDS[b]}."
        tool, args = "convert_units", {"value": v, "from_unit": a, "to_unit": b}
    elif kind == "date_add":
        d, n = _rand_date(rng), rng.choice([-1, 1]) * rng.randrange(1, 1000)
        q = f"What date is {abs(n)} days {'after' if n > 0 else 'before'} {d}? (dates as YYYY-MM-DD)"
        tool, args = "date_add", {"date": d, "days": n}
    elif kind == "date_diff":
        a, b = sorted([_rand_date(rng), _rand_date(rng)])
        q = f"How many days are there from {a} to {b}?"
        tool, args = "date_diff", {"start": a, "end": b}
    else:
        d = _rand_date(rng)
        q = f"What day of the week was {d}?"
        tool, args = "weekday", {"date": d}
    expected = {
        "calculator": calculator,
        "convert_units": convert_units,
        "date_add": date_add,
        "date_diff": date_diff,
        "weekday": weekday,
    }[tool](**args)
    names = sorted(TOOL_SPECS)
    call = json.dumps({"name": tool, "arguments": args})
    meta = {"tools": [TOOL_SPECS[n] for n in names], "expected_tool": tool, "expected_result": expected}
    return Example(
        prompt=_prompt(q, names),
        answer=f"<tool_call>{call}</tool_call>",
        meta=meta,
        id=f"tools/{kind}/{hashlib.sha1(q.encode()).hexdigest()[:10]}",
    )


def _check_spec(spec, where: str) -> dict:
    if isinstance(spec, str):
        if spec not in TOOL_SPECS:
            raise ConfigError(f"{where}: unknown built-in tool {spec!r}; built-in: {', '.join(sorted(TOOL_SPECS))}")
        return TOOL_SPECS[spec]
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError(f"{where}: a tool is a built-in name or {{name, description, parameters}}")
    params = spec.get("parameters", {"type": "object"})
    try:
        jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator).check_schema(params)
    except jsonschema.SchemaError as e:
        raise ConfigError(f"{where}: tool {spec['name']!r} has an invalid JSON schema: {e.message}") from e
    return {"name": spec["name"], "description": spec.get("description", ""), "parameters": params}


def load_items(path: str) -> list[Example]:
    """Examples from a local JSONL file (see the module docstring)."""
    out = []
    for where, rec in read_jsonl(path):
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec.get("tools"):
            raise ConfigError(f"{where}: needs 'prompt' (str) and 'tools' (list)")
        tools = [_check_spec(s, where) for s in rec["tools"]]
        meta = {"tools": tools}
        if rec.get("expected_tool") is not None:
            meta["expected_tool"] = rec["expected_tool"]
        if "expected_arguments" in rec:
            meta["expected_arguments"] = rec["expected_arguments"]
        elif "expected_result" in rec:
            tool = rec.get("expected_tool")
            if tool not in TOOL_FUNCTIONS:
                raise ConfigError(f"{where}: expected_result needs expected_tool naming a built-in tool")
            meta["expected_result"] = rec["expected_result"]
        else:
            raise ConfigError(f"{where}: needs expected_result or expected_arguments")
        names = [t["name"] for t in tools]
        prompt = f"Available tools (JSON schema of each tool's arguments):\n{json.dumps(tools)}\n\n{rec['prompt']}"
        out.append(
            Example(
                prompt=prompt,
                answer=json.dumps(rec.get("expected_arguments", rec.get("expected_result"))),
                meta=meta,
                id=str(rec.get("id", f"{where}:{'/'.join(names)}")),
            )
        )
    if not out:
        raise ConfigError(f"task_args.path: {Path(path).expanduser().name} holds no items")
    return out


class ToolsTask:
    """One tool call per question; rewarded by `tool_call`."""

    name = "tools"
    system_prompt = SYSTEM_PROMPT
    default_rewards = [{"name": "tool_call", "weight": 1.0}]

    def __init__(self, seed: int, path: str | None = None, eval_size: int | None = None) -> None:
        check_optional_count("eval_size", eval_size)
        check_optional_path("path", path)
        self.seed = seed
        self._items: list[Example] | None = None
        if path is None:
            n = 50 if eval_size is None else eval_size
            rng = random.Random(f"tools-eval-{seed}")
            self._eval = [generate(rng) for _ in range(n)]
            self._eval_prompts = {e.prompt for e in self._eval}
        else:
            self._items, self._eval = split_held_out(load_items(path), seed, eval_size)

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """n training questions (built-in: freshly generated, never one of the eval prompts)."""
        if self._items is not None:
            return [rng.choice(self._items) for _ in range(n)]
        out = []
        while len(out) < n:
            ex = generate(rng)
            if ex.prompt not in self._eval_prompts:
                out.append(ex)
        return out

    def eval_set(self) -> list[Example]:
        """The held-out questions (fixed by the seed)."""
        return list(self._eval)
