"""The source tree keeps its shape: no import cycles between grpolab modules, no oversized files, and
the README's layout section names every module there is."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "grpolab"
ROOT = SRC.parents[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """grpolab modules that `path` imports when it runs: top level or inside functions (a lazy import
    runs too), but not under `if TYPE_CHECKING:` (never executed)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for n in ast.walk(node)}
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from pkg import submodule` imports the submodule; `from pkg import name` runs pkg itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != this:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = sorted(SRC.rglob("*.py"))
    modules = {module_name(p) for p in files}
    # importing a.b.c runs a and a.b first: a package's __init__ is an edge only if it imports back
    return {module_name(p): {m for m in imports_of(p, modules) if m != "grpolab"} for p in files}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None


def test_no_module_imports_itself_back_through_a_cycle():
    g = graph()
    assert "grpolab.step" in g and "grpolab.trainer" in g["grpolab.cli"]  # the graph is read
    assert find_cycle(g) is None, " -> ".join(find_cycle(g))


def test_algos_imports_no_other_grpolab_module_but_types():
    assert graph()["grpolab.algos"] == {"grpolab.types"}


def test_no_source_file_outside_the_sandbox_is_over_500_lines():
    big = {str(p.relative_to(ROOT)): n for p in SRC.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 500 and "sandbox" not in p.parts}
    assert not big, big


def test_readme_layout_names_every_module():
    text = (ROOT / "README.md").read_text()
    layout = text.split("## Layout", 1)[1]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py|/)", layout))
    for p in sorted(SRC.iterdir()):
        if p.name.startswith(("_", ".")) or p.name == "data":
            continue
        name = p.name if p.suffix == ".py" else p.name + "/"
        assert name in words, f"README.md's layout does not mention src/grpolab/{name}"
