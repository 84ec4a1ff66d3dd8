"""The source tree keeps its shape: no import cycles between grpolab modules, no oversized files, and
docs/layout.md names every module there is."""

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
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, modules: set[str], *, types: bool = False) -> set[str]:
    """grpolab modules that `path` imports when it runs: top level or inside functions (a lazy import
    runs too), but not under `if TYPE_CHECKING:` (never executed) unless `types`."""
    tree = ast.parse(path.read_text())
    skip = (
        set()
        if types
        else {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and _is_type_checking(node)
            for n in ast.walk(node)
        }
    )
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
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
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
                return stack[stack.index(m) :] + [m]
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
    assert "grpolab.training.step" in g and "grpolab.training.trainer" in g["grpolab.app.cli"]  # the graph is read
    assert find_cycle(g) is None, " -> ".join(find_cycle(g))


def test_algos_imports_no_other_grpolab_module_but_the_fields():
    assert graph()["grpolab.algo.presets"] == {"grpolab.util.fields"}


def test_algo_names_nothing_above_it_not_even_as_a_type():
    """The maths (algo/) imports only itself and util/, also under `if TYPE_CHECKING:`: the step's
    contract with its components lives with the step (training/components.py)."""
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    named = {m for p in sorted((SRC / "algo").glob("*.py")) for m in imports_of(p, modules, types=True)}
    assert {"grpolab.algo.kl", "grpolab.algo.presets"} <= named  # the imports are read, types included
    above = sorted(m for m in named if folder_of(m) not in ("algo", "util"))
    assert not above, above


# The layers, from the ground up. A module imports only its own folder and the layers below; two folders
# on one layer never import each other. The top-level modules: batch.py is a layer of its own, __main__
# stands above the applications. engine/native/ (the native decode loop) is part of engine/'s layer.
LAYERS = [
    {"util"},
    {"batch"},
    {"algo", "sandbox"},
    {"model", "rewards"},
    {"parallel", "tasks"},
    {"env", "engine"},
    {"training"},
    {"app"},
    {"__main__"},
]


def folder_of(module: str) -> str:
    return module.split(".")[1]


def layer_of(module: str) -> int:
    folder = folder_of(module)
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    raise AssertionError(f"{module}: its folder {folder!r} is on no layer of tests/test_layout.py's LAYERS")


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in g.items():
        if m == "grpolab":
            continue
        for d in deps:
            same_folder = folder_of(d) == folder_of(m)
            if not same_folder and layer_of(d) >= layer_of(m):
                bad.append(f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})")
    return sorted(bad)


def test_the_layer_check_sees_an_upward_import():
    g = {
        "grpolab.algo.losses": {"grpolab.model.passes"},
        "grpolab.model.passes": {"grpolab.algo.losses"},
        "grpolab.tasks.qa": {"grpolab.parallel.fsdp"},
    }
    assert layer_violations(g) == [
        "grpolab.algo.losses (layer 2) imports grpolab.model.passes (layer 3)",
        "grpolab.tasks.qa (layer 4) imports grpolab.parallel.fsdp (layer 4)",
    ]


def test_imports_point_down_the_layers():
    g = graph()
    assert {folder_of(m) for m in g if m != "grpolab"} <= set().union(*LAYERS)
    assert not layer_violations(g), "\n".join(layer_violations(g))


def test_every_folder_says_its_job_first():
    """Each layer folder's __init__.py opens with a docstring that names its layer."""
    for p in sorted(SRC.iterdir()):
        if p.is_dir() and (p / "__init__.py").exists():
            doc = ast.get_docstring(ast.parse((p / "__init__.py").read_text())) or ""
            assert len(doc) > 40, f"src/grpolab/{p.name}/__init__.py has no docstring that says its job"


def test_no_source_file_outside_the_sandbox_is_over_500_lines():
    big = {
        str(p.relative_to(ROOT)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500 and "sandbox" not in p.parts
    }
    assert not big, big


def test_layout_page_names_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\.py|/)", layout))
    for p in sorted(SRC.iterdir()):
        if p.name.startswith(("_", ".")) or p.name == "data":
            continue
        name = p.name if p.suffix == ".py" else p.name + "/"
        assert name in words, f"docs/layout.md does not mention src/grpolab/{name}"
    folders = ("util", "algo", "model", "parallel", "engine", "engine/native", "training", "training/plan")
    for folder in folders:  # each module named
        for p in sorted((SRC / folder).glob("*.py")):
            if p.name != "__init__.py":
                assert p.name in words, f"docs/layout.md does not mention src/grpolab/{folder}/{p.name}"


def test_the_llama_family_is_written_once():
    """The model types grpolab's own attention and lean decode step take live in one tuple
    (grpolab.model.attention.LLAMA_FAMILY); grpolab plan and the native engine decide by
    grpolab.engine.native.decoder.lean_decodes instead of a copy of it."""
    spelled = re.compile(r"""["']llama["']\s*,\s*["']qwen2["']""")
    where = sorted(str(p.relative_to(ROOT)) for p in SRC.rglob("*.py") if spelled.search(p.read_text()))
    assert where == ["src/grpolab/model/attention.py"], where
