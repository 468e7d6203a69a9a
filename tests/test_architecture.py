"""The packages stand on floors and import only downward (docs/architecture.md).

The import graph is read from the source (every ``import`` statement, at module level or inside a function), so
an import hidden in a function to dodge a cycle is caught like any other. The checks:

* no package imports a package on its own floor or above; inside ``methods/`` no module imports up its floors
  (:data:`METHODS_FLOORS`), and no package above it imports a model family;
* no cycle among the project's modules;
* no project import inside a function, except the documented lazy optional dependencies in :data:`LAZY_ALLOWED`.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

from tests import methods_figures as figures

ROOT = Path(__file__).resolve().parent.parent

#: bottom to top; a package may import its own modules and the packages of strictly lower floors
FLOORS: List[Tuple[str, ...]] = [
    ("methods",),
    ("models",),
    ("evaluation",),
    ("datamodules",),
    ("lightning_modules",),
    ("callbacks",),
    ("cli", "comparison"),
    ("training",),
    ("train", "evaluate", "compare"),
]
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}

#: the floors inside ``methods/``, bottom to top: the core (the adapter interface and plain helpers), the shared LRP
#: floor, the model families (one folder each), the method files; a module of ``methods`` not named here is a method
#: file. A module imports its own floor and the floors below (families may build on each other, e.g. SigLIP on CLIP).
METHODS_FLOORS: List[Tuple[str, ...]] = [
    ("methods.adapters", "methods.targets", "methods.model_state", "methods.config_values", "methods.cpu_memory",
     "methods.maps"),
    ("methods.lrp",),
    ("methods.families",),
]
#: the packages above ``methods`` reach a family only through the core (``adapter_for``, ``methods.adapters.tokens``)
FAMILIES = "methods.families"

#: ``file:imported module`` pairs allowed inside a function (documented lazy optional dependencies); none today
LAZY_ALLOWED: Set[str] = set()


def project_files() -> Dict[str, Path]:
    """``{module name: file}`` of every package on a floor and the entry points."""
    files: Dict[str, Path] = {}
    for package in FLOOR:
        folder, script = ROOT / package, ROOT / f"{package}.py"
        if folder.is_dir():
            for path in folder.rglob("*.py"):
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        elif script.is_file():
            files[package] = script
    return files


def imports_of(module: str, path: Path, known: Set[str]) -> List[Tuple[str, int, bool]]:
    """``(imported project module, line, inside a function)`` for every project import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    in_function = {id(sub) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
    package_parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package_parts[:len(package_parts) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known),
                          None)
            entry = (target, node.lineno, id(node) in in_function)
            if target is not None and target != module and entry not in found:
                found.append(entry)
    return found


def graph() -> Tuple[Dict[str, Path], Dict[str, List[Tuple[str, int, bool]]]]:
    files = project_files()
    return files, {module: imports_of(module, path, set(files)) for module, path in files.items()}


def test_every_project_package_stands_on_a_floor():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - {"tests", "benchmarks"}
    assert packages <= set(FLOOR), f"packages without a floor (add them to FLOORS and docs/architecture.md): " \
                                   f"{sorted(packages - set(FLOOR))}"


def test_imports_go_only_down_a_floor():
    files, edges = graph()
    upward = [f"{files[m].relative_to(ROOT)}:{line} imports {target}"
              for m, targets in edges.items() for target, line, _ in targets
              if target.split(".")[0] != m.split(".")[0] and FLOOR[target.split(".")[0]] >= FLOOR[m.split(".")[0]]]
    assert not upward, "imports on the same floor or up one:\n" + "\n".join(sorted(upward))


def methods_floor(module: str) -> int:
    """The floor of a module of ``methods`` (:data:`METHODS_FLOORS`; the method files on top)."""
    for level, prefixes in enumerate(METHODS_FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return len(METHODS_FLOORS)


def test_methods_imports_go_only_down_its_floors():
    """core < lrp < families < method files (docs/architecture.md)."""
    files, edges = graph()
    upward = [f"{files[m].relative_to(ROOT)}:{line} imports {target}"
              for m, targets in edges.items() if m.split(".")[0] == "methods" for target, line, _ in targets
              if target.split(".")[0] == "methods" and methods_floor(target) > methods_floor(m)]
    assert not upward, "imports up a floor inside methods/:\n" + "\n".join(sorted(upward))


def test_no_package_above_methods_imports_a_family():
    files, edges = graph()
    reaching = [f"{files[m].relative_to(ROOT)}:{line} imports {target}"
                for m, targets in edges.items() if m.split(".")[0] != "methods" for target, line, _ in targets
                if target == FAMILIES or target.startswith(FAMILIES + ".")]
    assert not reaching, "a family module imported outside methods/ (use methods.adapters):\n" + "\n".join(reaching)


def test_no_import_cycle():
    _, edges = graph()
    adjacency = {m: sorted({t for t, _, _ in targets}) for m, targets in edges.items()}
    state: Dict[str, int] = {}
    cycles = []

    def visit(module: str, stack: List[str]) -> None:
        state[module] = 1
        for target in adjacency[module]:
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [module, target]))
            elif target not in state:
                visit(target, stack + [module])
        state[module] = 2

    for module in sorted(adjacency):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_project_import_inside_a_function():
    files, edges = graph()
    lazy = [f"{files[m].relative_to(ROOT)}:{line} imports {target}"
            for m, targets in edges.items() for target, line, inside in targets
            if inside and f"{files[m].relative_to(ROOT)}:{target}" not in LAZY_ALLOWED]
    assert not lazy, "project imports inside functions (move them to the top of the module, or document a lazy " \
                     "optional dependency in LAZY_ALLOWED):\n" + "\n".join(sorted(lazy))


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself: a file that imports up a floor and one that imports inside a function are found."""
    path = tmp_path / "probe.py"
    path.write_text("import callbacks.base\n\ndef f():\n    from models import loading\n")
    found = imports_of("methods.probe", path, {"callbacks.base", "models", "models.loading", "methods.probe"})
    assert ("callbacks.base", 1, False) in found and ("models.loading", 4, True) in found


def test_the_methods_floors_are_ordered():
    """The checker's floors: core < lrp < families < method files, and a method file is on top by default."""
    floors = [methods_floor(m) for m in ("methods.adapters.base", "methods.lrp.engine",
                                         "methods.families.hf_text.adapter", "methods.rollout")]
    assert floors == sorted(floors) and len(set(floors)) == 4
    assert methods_floor("methods.targets") == methods_floor("methods.adapters.tokens") == 0


def test_methods_keep_their_shape():
    """Issue 33's figures that are checks: no function in ``methods/`` over 60 lines, no capability probed with
    ``getattr(adapter, ...)``, no LRP topology reading the raw model, at most 20 members in the adapter core
    (tests/methods_figures.py)."""
    assert not figures.long_functions(ROOT), f"functions over {figures.MAX_FUNCTION_LINES} lines (split them)"
    methods, attributes = figures.adapter_members(ROOT)
    assert methods + attributes <= figures.MAX_ADAPTER_MEMBERS, (
        f"ModelAdapter has {methods} methods and {attributes} class attributes (at most "
        f"{figures.MAX_ADAPTER_MEMBERS} members: declare what only some methods need as a capability object)")
    probes = [str(p.relative_to(ROOT)) for p in figures.python_files(ROOT, "methods")
              if "getattr(adapter" in p.read_text()]
    assert not probes, f"capabilities probed with getattr(adapter, ...) (declare them on the adapter): {probes}"
    assert figures.raw_model_reads(ROOT) == 0, "an LRP topology reads the raw model (ask its adapter)"
