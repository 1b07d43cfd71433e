"""No import cycle among the modules of ``scaling/``, ``sweeps/`` and ``analysis/``.

The rule: module A depends on module B when A's source imports B anywhere, at the top of the file or
inside a function. A lazy import breaks a cycle only at run time, not in the design: the two modules
still cannot be read, tested or moved apart, so it counts. Two kinds of import do not count:
- under ``if TYPE_CHECKING:``: they never run;
- under ``if __name__ == "__main__":``: that code runs only when the file is started as a script
  (``python -m scaling.data``), and then as the module ``__main__``, not as the module the others import.
  This is how a command keeps its name while its command line lives in a module of its own, which
  imports the module the command is named after. Importing ``a.b.c`` also runs the ``__init__.py`` of ``a`` and ``a.b``, so it depends on
those packages too, unless they enclose the importer (a package is set up before its modules).
``from a.b import name`` depends on ``a.b.name`` when that is a module, else on ``a.b`` itself.

The graph is read from the source (``ast``), so the test imports nothing it checks; subpackages are
walked like top-level modules.
"""

import ast
import pathlib

from helpers import REPO

PACKAGES = ("scaling", "sweeps", "analysis")

# Cycles that changes under way remove: the trainer's rewrite (one loop; ``train`` re-exports its command
# line's names), the cloud code's move into ``sweeps/cloud/``, the preflight's own options. Each passes only
# exactly as it stands (a module joining it fails), and an entry that is no longer a cycle fails too, so
# this list only shrinks; delete an entry with the change that breaks its cycle.
PENDING = [  # by file, so that a move of the modules rewrites them with the rest of the paths
]


def module_files(root: pathlib.Path = REPO, packages=PACKAGES) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``packages``."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_script_part(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _import_nodes(tree: ast.AST):
    """Every import statement of a module, in or out of functions, except those the rule above leaves out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and (_is_type_checking(node.test) or _is_script_part(node.test)):
            children = node.orelse
        stack.extend(children)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: pathlib.Path = REPO, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """Module -> {module it depends on: the line of the first import that says so} (see the rule above)."""
    files = module_files(root, packages)
    graph = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        own_packages = set(_ancestors(module)) | ({module} if is_package else set())
        edges = graph.setdefault(module, {})

        def depend(target: str, line: int, explicit: bool = True) -> None:
            for package in _ancestors(target):
                if package in files and package not in own_packages:
                    edges.setdefault(package, line)
            if target in files and target != module and (explicit or target not in own_packages):
                edges.setdefault(target, line)

        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    known = [p for p in _ancestors(alias.name) + [alias.name] if p in files]
                    if known:
                        depend(known[-1], node.lineno)
                continue
            source = _absolute(node, module, is_package)
            for alias in node.names:
                if f"{source}.{alias.name}" in files:
                    depend(f"{source}.{alias.name}", node.lineno)
                elif source in files:
                    depend(source, node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (or a module importing itself)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, {})))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, {}):
                        components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(components)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, as a list of modules (first = last)."""
    start, members = component[0], set(component)
    parents, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node]):
                if successor == start:
                    path = [node]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return path[::-1] + [start]
                if successor in members and successor not in parents:
                    parents[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    cycle = shortest_cycle(graph, component)
    arrows = [f"  {a} -> {b} (line {graph[a][b]} of {a})" for a, b in zip(cycle, cycle[1:])]
    return f"cycle among {', '.join(component)}:\n" + "\n".join(arrows)


def test_no_import_cycle():
    graph = import_graph()
    components = strongly_connected(graph)
    files = {name: str(path.relative_to(REPO)) for name, path in module_files().items()}
    as_files = [{files[name] for name in component} for component in components]
    cycles = [describe(graph, component) for component, paths in zip(components, as_files) if paths not in PENDING]
    assert not cycles, "import cycles (see the rule in this file's docstring):\n" + "\n".join(cycles)
    gone = [sorted(pending) for pending in PENDING if pending not in as_files]
    assert not gone, f"no longer cycles, delete them from PENDING: {gone}"


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_walk_finds_lazy_and_package_cycles_and_skips_script_parts(tmp_path):
    _write(tmp_path, {
        "house/__init__.py": "",
        "house/plan.py": "import json\n",
        "house/walls/__init__.py": "from house.walls import brick\n",  # the package runs its module
        "house/walls/brick.py": "from house import plan\n\ndef f():\n    from ..roof import tile\n",
        "house/roof/__init__.py": "",
        "house/roof/tile.py": "from house.walls.brick import f\n",  # lazy arrow back: a cycle
        "house/roof/__main__.py": "from house.roof import tile\n",
        "house/door.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from house import key\n"
                          "if __name__ == '__main__':\n    from house import key\n"),
        "house/key.py": "from house import door\n",
    })
    graph = import_graph(tmp_path, ("house",))
    assert graph["house.roof.__main__"] == {"house.roof.tile": 1}  # its own package: set up before it
    assert set(graph["house.roof.tile"]) == {"house.walls", "house.walls.brick"}
    assert graph["house.door"] == {}
    components = strongly_connected(graph)
    assert components == [["house.roof.tile", "house.walls", "house.walls.brick"]]
    assert "house.walls.brick -> house.roof.tile (line 4" in describe(graph, components[0])
