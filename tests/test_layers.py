"""The architecture's rules that a linter can check: the import contracts of pyproject.toml
(``lint-imports``) and no private name used across modules. docs/architecture.md says why."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "slayer_lsp"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private_uses(path: Path) -> list[str]:
    """``from slayer_lsp.x import _name`` and ``module._name`` on a project module bound by an import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module_name(path)
    modules: dict[str, str] = {}  # local alias -> project module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("slayer_lsp"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if importlib.util.find_spec(node.module) and _is_module(target):
                    modules[alias.asname or alias.name] = target
                elif alias.name.startswith("_") and not alias.name.startswith("__") and node.module != here:
                    found.append(f"{here}:{node.lineno} imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("slayer_lsp") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and modules[node.value.id] != here
        ):
            found.append(f"{here}:{node.lineno} uses {modules[node.value.id]}.{node.attr}")
    return found


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def test_no_private_name_crosses_a_module() -> None:
    found = [use for path in sorted(PACKAGE.rglob("*.py")) for use in _private_uses(path)]
    assert found == [], "private names used across modules:\n" + "\n".join(found)


def test_the_private_name_check_sees_both_forms(tmp_path: Path) -> None:
    probe = PACKAGE / "_layers_probe.py"
    probe.write_text(
        "from slayer_lsp.catalog.snapshot import _model_sort\n"
        "from slayer_lsp.catalog import snapshot\n"
        "x = snapshot._model_sort\n",
        encoding="utf-8",
    )
    try:
        assert len(_private_uses(probe)) == 2
    finally:
        probe.unlink()


@pytest.mark.skipif(
    shutil.which("lint-imports") is None and importlib.util.find_spec("importlinter") is None,
    reason="import-linter is not installed",
)
def test_import_contracts_hold() -> None:
    """store -> catalog -> query -> texts -> reach -> writer -> embed -> {search, analysis} -> engine
    -> front ends, and only lsp/ (mcp/) imports the LSP (MCP) packages."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
