"""The structural figures of ``methods/`` that issue 33 tracks, read from the source with ``ast`` (nothing runs).

    PYTHONPATH=. python -m tests.methods_figures [ROOT]

Prints: the members of ``ModelAdapter`` (methods and class attributes in its class body), the ``getattr(adapter``
probes in ``methods/``, the reads of the raw model in the LRP topologies (attribute reads on ``adapter.model`` /
``self.model`` or on a name bound to the raw model: ``model``, ``m``), the files outside ``methods/`` that import a
family module, the functions in ``methods/`` over :data:`MAX_FUNCTION_LINES` lines and the line count of
``methods/``. ``tests/test_architecture.py`` holds the ones that are checks.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

MAX_FUNCTION_LINES = 60
#: issue 33: the adapter core (the class body of ``ModelAdapter``) has at most this many members
MAX_ADAPTER_MEMBERS = 20
#: modules of methods/ that are no family (the shared floors) before and after the families became folders
SHARED_ADAPTER_MODULES = {"__init__", "base", "recorder", "gradient_rules", "tokens"}
SHARED_LRP_MODULES = {"__init__", "engine", "rules", "sublayers", "topology"}
RAW_MODEL_NAMES = {"model", "m"}


def python_files(root: Path, folder: str) -> List[Path]:
    """The ``.py`` files under ``root/folder``, sorted."""
    return sorted(path for path in (root / folder).rglob("*.py") if "__pycache__" not in path.parts)


def functions(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> List[Tuple[str, str, int]]:
    """``(file, function, lines)`` of each function in ``methods/`` longer than ``limit`` lines (``def`` to end)."""
    found = []
    for path in python_files(root, "methods"):
        for fn in functions(ast.parse(path.read_text())):
            lines = fn.end_lineno - fn.lineno + 1  # type: ignore[attr-defined]
            if lines > limit:
                found.append((str(path.relative_to(root)), fn.name, lines))  # type: ignore[attr-defined]
    return found


def adapter_members(root: Path) -> Tuple[int, int]:
    """``(methods, class attributes)`` in the body of ``class ModelAdapter``."""
    for path in python_files(root, "methods"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "ModelAdapter":
                methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
                attrs = sum(isinstance(n, (ast.Assign, ast.AnnAssign)) for n in node.body)
                return methods, attrs
    raise LookupError("no class ModelAdapter in methods/")


def is_topology_file(rel: str) -> bool:
    parts = Path(rel).parts
    if parts[:2] == ("methods", "lrp"):
        return Path(rel).stem not in SHARED_LRP_MODULES
    return "families" in parts and ("topology" in Path(rel).stem or Path(rel).stem == "lrp")


def raw_model_reads(root: Path) -> int:
    """Attribute reads (and ``getattr`` calls) on the raw model in the LRP topologies."""
    def is_raw(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in RAW_MODEL_NAMES) or (
            isinstance(node, ast.Attribute) and node.attr == "model")
    count = 0
    for path in python_files(root, "methods"):
        if not is_topology_file(str(path.relative_to(root))):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and is_raw(node.value):
                count += 1
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "hasattr") and node.args and is_raw(node.args[0])):
                count += 1
    return count


def family_module(name: str) -> bool:
    """Whether dotted module ``name`` is a family module (before: a non-shared module of ``methods.adapters`` or
    ``methods.lrp``; after: anything under ``methods.families``)."""
    parts = name.split(".")
    if parts[:2] == ["methods", "families"]:
        return len(parts) > 2
    if parts[:2] == ["methods", "adapters"] and len(parts) > 2:
        return parts[2] not in SHARED_ADAPTER_MODULES
    if parts[:2] == ["methods", "lrp"] and len(parts) > 2:
        return parts[2] not in SHARED_LRP_MODULES
    return False


def family_importers(root: Path, folders=("callbacks", "cli", "comparison", "datamodules", "evaluation",
                                          "lightning_modules", "models", "training", "benchmarks")) -> List[str]:
    """Files outside ``methods/`` (and outside ``tests/``) that import a family module, or a family's class or
    function through a package that re-exports it (resolved by importing the package)."""
    import importlib
    sys.path.insert(0, str(root))
    found = []
    for folder in folders:
        for path in python_files(root, folder):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                    if node.module.startswith("methods"):
                        package = importlib.import_module(node.module)
                        for alias in node.names:
                            value = getattr(package, alias.name, None)
                            module = getattr(value, "__module__", None) or getattr(value, "__name__", "")
                            names.append(module)
                if any(family_module(n) for n in names):
                    found.append(str(path.relative_to(root)))
                    break
    return found


def line_count(root: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in python_files(root, "methods"))


def main(root: Path) -> None:
    methods, attrs = adapter_members(root)
    getattrs = sum(path.read_text().count("getattr(adapter") for path in python_files(root, "methods"))
    print(f"ModelAdapter members: {methods + attrs} ({methods} methods, {attrs} class attributes)")
    print(f"'getattr(adapter' in methods/: {getattrs}")
    print(f"raw-model reads in the LRP topologies: {raw_model_reads(root)}")
    importers = family_importers(root)
    print(f"files outside methods/ importing a family module: {len(importers)} {importers}")
    long = long_functions(root)
    print(f"functions in methods/ over {MAX_FUNCTION_LINES} lines: {len(long)} {long}")
    print(f"lines of methods/*.py: {line_count(root)}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
