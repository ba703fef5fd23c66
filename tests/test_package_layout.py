"""The package's layers: what ``import encoder_cache`` exposes, and that the
runtime (what serving imports) depends on neither the twin nor the simulator."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import encoder_cache

PACKAGE = Path(encoder_cache.__file__).resolve().parent
#: The modules vLLM serving imports; the twin and the simulator are tools beside them.
RUNTIME = [
    "__init__.py",
    "budget.py",
    "invariants.py",
    "request.py",
    "step_api.py",
    "vllm.py",
    "observed.py",
    "metrics.py",
    *(f"events/{path.name}" for path in sorted((PACKAGE / "events").glob("*.py"))),
]


def test_the_namespace_is_the_public_api():
    public = {name for name in vars(encoder_cache) if not name.startswith("_")}
    submodules = {name for name in public if isinstance(getattr(encoder_cache, name), types.ModuleType)}
    assert public - submodules == set(encoder_cache.__all__)
    assert not {"version", "PackageNotFoundError", "metadata"} & public
    assert isinstance(encoder_cache.__version__, str) and encoder_cache.__version__


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def test_runtime_modules_import_neither_the_twin_nor_the_simulator():
    for name in RUNTIME:
        imported = _imported_modules(PACKAGE / name)
        tools = sorted(m for m in imported if m.startswith(("encoder_cache.reference", "encoder_cache.simulator")))
        assert not tools, f"{name} imports {tools}"


def test_importing_the_runtime_loads_no_tool_module():
    code = (
        "import sys, encoder_cache, encoder_cache.budget, encoder_cache.invariants, encoder_cache.request, "
        "encoder_cache.step_api\n"
        "print(sorted(m for m in sys.modules if m.startswith(('encoder_cache.reference', 'encoder_cache.simulator'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "[]"
