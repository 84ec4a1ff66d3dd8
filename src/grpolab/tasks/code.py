"""The `code` task: write a small Python function; rewarded by the sandboxed `code` verifier.

Built in: the problems in grpolab/data/code_problems.jsonl (small function-writing problems with
tests). With `task_args: {path: file.jsonl}` problems come from a local JSONL file in any of these
shapes (one object per line, detected per line):

    grpolab:   {"id", "entry_point", "tests": [assert...], "description" | "prompt",
                "signature"?, "solution"?, "setup"?}
    MBPP:      {"task_id", "text" | "prompt", "code", "test_list", "test_setup_code"?}
    HumanEval: {"task_id", "prompt", "canonical_solution", "test", "entry_point"}

HumanEval's check() is read statement by statement: an assertion about the candidate is a test,
everything before it (imports, helper data) is that test's setup, and all of it runs in order in
one namespace; the prompt (helpers such as `poly`) and the rest of the test file run first
(meta["check_setup"]). `import` lines and `assert True` are never tests.

By default tests must be asserts that grpolab.rewards.code can grade in the parent (a call
compared with a literal); problems with other tests are skipped, with a warning, unless
`allow_assert_tests: true`, which runs them in the sandbox's checker process (see
grpolab.rewards.code and docs/security.md).

task_args: path (str), eval_size (int, default 20% of the problems), allow_assert_tests (bool).
"""

from __future__ import annotations

import ast
import json
import logging
import random
from importlib import resources

from grpolab.batch import Example
from grpolab.rewards.code import UnconvertibleTest, convert_tests, is_test, taint
from grpolab.tasks._args import check_optional_count, check_optional_path, read_jsonl
from grpolab.util.fields import ConfigError

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a careful Python programmer. Think briefly, then give your final solution as one "
    "complete Python function in a single ```python code block."
)


def _builtin_records() -> list[dict]:
    """The problems shipped as package data (grpolab/data/code_problems.jsonl)."""
    text = resources.files("grpolab").joinpath("data", "code_problems.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _entry_from_tests(tests: list[str]) -> str | None:
    """The function called in the first assert (MBPP does not name its entry point)."""
    for src in tests:
        try:
            tree = ast.parse(src.strip())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id not in ("abs", "set", "sorted", "len", "list", "tuple", "round", "str", "int", "float")
            ):
                return node.func.id
    return None


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self.new, ctx=node.ctx), node) if node.id == self.old else node


def humaneval_tests(test_src: str, entry_point: str) -> tuple[list[str], str]:
    """HumanEval's `def check(candidate)` as grpolab tests, plus the check code's own module setup.

    Every statement of check() runs, in order, in one namespace. A statement that asserts something
    about the candidate (or about a value computed from it) is a test; the statements before it
    (imports, helper data, `assert True`) are its setup and are kept with it. `candidate` is
    renamed to the entry point everywhere (both names mean the candidate in the checker).
    Returns (tests, module_setup) where module_setup is test_src minus check() (METADATA, imports).
    """
    tree = ast.parse(test_src)
    tests, module = [], []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == "check"):
            module.append(ast.unparse(node))
            continue
        param = node.args.args[0].arg if node.args.args else "candidate"
        body_names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        # keep `candidate` where check() also uses the entry point's name for something else
        rename = _Rename(param, entry_point if entry_point not in body_names else "candidate")
        about = {entry_point, "candidate", param}
        pending: list[str] = []
        for stmt in node.body:
            if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            text = ast.unparse(rename.visit(stmt))
            if is_test(stmt, about):
                tests.append("\n".join(pending + [text]))
                pending = []
            else:
                pending.append(text)
                about = taint(stmt, about)
    return tests, "\n".join(module)


def humaneval_asserts(test_src: str, entry_point: str) -> list[str]:
    """The tests of HumanEval's `def check(candidate)` (see humaneval_tests)."""
    return humaneval_tests(test_src, entry_point)[0]


def _imports_of(src: str) -> str:
    return "\n".join(ln for ln in src.splitlines() if ln.startswith(("import ", "from ")))


def normalize_record(rec: dict, where: str) -> dict:
    """Any supported JSONL shape -> {id, prompt, entry_point, tests, setup, solution}."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    if "test" in rec and "entry_point" in rec and "prompt" in rec:  # HumanEval
        ep = rec["entry_point"]
        tests, module_setup = humaneval_tests(rec["test"], ep)
        return {
            "id": str(rec.get("task_id", "")),
            "entry_point": ep,
            "tests": tests,
            "setup": _imports_of(rec["prompt"]),
            "check_setup": "\n".join(x for x in (rec["prompt"], module_setup) if x.strip()),
            "solution": rec["prompt"] + rec.get("canonical_solution", ""),
            "prompt": (
                "Complete the following Python function. Give the complete function in a "
                f"```python code block.\n\n```python\n{rec['prompt']}```"
            ),
        }
    if "test_list" in rec:  # MBPP (original or sanitized)
        tests = list(rec["test_list"])
        ep = _entry_from_tests(tests)
        if ep is None:
            raise ConfigError(f"{where}: cannot tell the function name from test_list")
        text = rec.get("text") or rec.get("prompt") or ""
        return {
            "id": str(rec.get("task_id", "")),
            "entry_point": ep,
            "tests": tests,
            "setup": rec.get("test_setup_code", "") or "",
            "check_setup": rec.get("test_setup_code", "") or "",
            "solution": rec.get("code", ""),
            "prompt": f"{text}\nThe function must be named `{ep}`; for example, it must pass:\n{tests[0]}\n"
            "Give the function in a ```python code block.",
        }
    if "tests" in rec and "entry_point" in rec:  # grpolab's own shape
        desc = rec.get("description") or rec.get("prompt") or ""
        sig = rec.get("signature")
        prompt = (
            f"Write a Python function `{sig}`.\n{desc}\nGive the complete function in a ```python code block."
            if sig
            else desc
        )
        return {
            "id": str(rec.get("id", "")),
            "entry_point": rec["entry_point"],
            "tests": list(rec["tests"]),
            "setup": rec.get("setup", ""),
            "check_setup": rec.get("check_setup", ""),
            "solution": rec.get("solution", ""),
            "prompt": prompt,
        }
    raise ConfigError(f"{where}: unrecognised record (expected grpolab, MBPP or HumanEval fields)")


def load_problems(path: str | None, allow_assert_tests: bool = False) -> list[dict]:
    """Built-in problems, or those of a local JSONL file; unconvertible ones skipped unless allowed."""
    if path is None:
        raw = [(f"code_problems.jsonl:{i + 1}", r) for i, r in enumerate(_builtin_records())]
    else:
        raw = read_jsonl(path)
    problems, skipped = [], 0
    for where, rec in raw:
        prob = normalize_record(rec, where)
        if not prob["tests"]:
            skipped += 1
            continue
        try:
            convert_tests(prob["tests"], prob["entry_point"], allow_assert_tests)
        except UnconvertibleTest as e:
            skipped += 1
            log.debug("skipping %s: %s", where, e)
            continue
        prob["id"] = prob["id"] or where
        prob["allow_assert_tests"] = bool(allow_assert_tests)
        problems.append(prob)
    if skipped:
        log.warning(
            "code task: skipped %d of %d problems whose tests cannot be graded in the parent "
            "(set allow_assert_tests: true to keep them, with weaker guarantees)",
            skipped,
            len(raw),
        )
    if not problems:
        raise ConfigError("task_args: no usable code problems (all tests unconvertible? see allow_assert_tests)")
    return problems


class CodeTask:
    """Small function-writing problems graded by their tests in the sandbox."""

    name = "code"
    system_prompt = SYSTEM_PROMPT
    default_rewards = [{"name": "code", "weight": 1.0}]

    def __init__(
        self, seed: int, path: str | None = None, eval_size: int | None = None, allow_assert_tests: bool = False
    ) -> None:
        check_optional_path("path", path)
        check_optional_count("eval_size", eval_size)
        self.seed = seed
        problems = load_problems(path, bool(allow_assert_tests))
        order = list(range(len(problems)))
        random.Random(seed).shuffle(order)
        n_eval = max(1, len(problems) // 5) if eval_size is None else min(eval_size, len(problems))
        self._eval = [self._example(problems[i]) for i in sorted(order[:n_eval])]
        train = [problems[i] for i in sorted(order[n_eval:])] or problems
        self._train = [self._example(p) for p in train]

    @staticmethod
    def _example(p: dict) -> Example:
        meta = {"tests": p["tests"], "entry_point": p["entry_point"], "setup": p["setup"]}
        if p.get("check_setup"):
            meta["check_setup"] = p["check_setup"]
        if p.get("allow_assert_tests"):
            meta["allow_assert_tests"] = True
        return Example(prompt=p["prompt"], answer=p["solution"], meta=meta, id=f"code/{p['id']}")

    def sample(self, n: int, rng: random.Random) -> list[Example]:
        """n training problems drawn with replacement."""
        return [rng.choice(self._train) for _ in range(n)]

    def eval_set(self) -> list[Example]:
        """The held-out problems (fixed by the seed)."""
        return list(self._eval)
