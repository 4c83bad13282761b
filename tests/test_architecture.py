"""The package's layers import one way: no module reaches, directly or around a circle,
back into itself (docs/architecture.md draws the layers)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "ggrad"


def module_names() -> dict[str, Path]:
    """ggrad's modules by dotted name (a package by its own name, for its __init__)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("ggrad",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ggrad modules `name` imports anywhere in its file (inside functions too): a
    `from pkg import x` names the module pkg.x where there is one, else pkg itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ggrad"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("ggrad"):
                continue
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in modules else source)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_circle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One circle through the component's first module, for the failure message."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return component


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_the_scanner_finds_circles_and_resolves_submodules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert a_circle(["a", "b", "c"], graph) == ["a", "b", "c", "a"]
    modules = module_names()
    edges = imports_of("ggrad.runtime.pinned", modules["ggrad.runtime.pinned"], modules)
    assert "ggrad.runtime.device" in edges  # `from .device import ...`


def test_no_module_imports_itself_around_a_circle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(
        f"- {len(c)} modules: {' -> '.join(a_circle(c, graph))}\n  all: {', '.join(c)}" for c in found)


# docs/architecture.md's layers, bottom first (a module's layer: the longest prefix listed)
LAYERS = [
    ["ggrad.runtime", "ggrad.accelerator", "ggrad.backends", "ggrad.torch_checkpoint", "ggrad.gguf_file",
     "ggrad.tokenizer"],
    ["ggrad.lazy", "ggrad.dtypes", "ggrad.replay", "ggrad.anomaly"],
    ["ggrad.autograd", "ggrad.ops"],
    ["ggrad.tensor", "ggrad.random", "ggrad.checks", "ggrad.capture", "ggrad.gradcheck"],
    ["ggrad.functional"],
    ["ggrad.nn", "ggrad.optim", "ggrad.amp", "ggrad.cuda", "ggrad.models", "ggrad.creation"],
    ["ggrad.train", "ggrad.io", "ggrad.gguf", "ggrad.finetune", "ggrad.data", "ggrad.distributed", "ggrad.utils", "ggrad.sklearn",
     "ggrad.__main__"],
]


def layer_of(module: str) -> int | None:
    found = [(len(prefix), i) for i, layer in enumerate(LAYERS) for prefix in layer
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1] if found else None


def test_every_import_runs_down_the_layers():
    """No module imports one of a higher layer (a package's __init__ re-exports, and the
    package root, which gathers the public names, aside)."""
    modules = module_names()
    inits = {m for m, path in modules.items() if path.name == "__init__.py"}
    unplaced = sorted(m for m in modules if m != "ggrad" and layer_of(m) is None)
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    upward = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
              for m, deps in import_graph().items() if m not in inits
              for d in deps if d != "ggrad" and layer_of(d) > layer_of(m)]
    assert not upward, "imports that run up:\n" + "\n".join(upward)
