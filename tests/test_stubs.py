"""The compiled classes document themselves: every public method and property
of both managers has a docstring, and it is the one ``_core.pyi`` holds, so
``help()`` and an editor show the same text. (``make test`` also runs mypy's
stubtest, which checks the stub's names and signatures against the module.)"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import encoder_cache
from encoder_cache import _core

STUB = Path(_core.__file__).with_name("_core.pyi")
CLASSES = ["EncoderCacheManager", "EncoderDecoderCacheManager"]


def stub_docs() -> dict[str, dict[str, str | None]]:
    """Class name -> member name ('' for the class) -> the stub's docstring."""
    tree = ast.parse(STUB.read_text())
    docs: dict[str, dict[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in CLASSES:
            members: dict[str, str | None] = {"": ast.get_docstring(node)}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    # A property's setter has no docstring of its own: keep the getter's.
                    members.setdefault(item.name, ast.get_docstring(item))
            docs[node.name] = members
    return docs


def public_members(cls: type) -> list[str]:
    return sorted(name for name in vars(cls) if not name.startswith("_"))


@pytest.mark.parametrize("name", CLASSES)
def test_every_public_member_has_a_docstring_that_matches_its_stub(name: str) -> None:
    cls = getattr(_core, name)
    stub = stub_docs()[name]
    assert inspect.getdoc(cls) and inspect.getdoc(cls) == stub[""]
    assert public_members(cls) == sorted(m for m in stub if m), "the stub lists exactly the runtime's members"
    for member in public_members(cls):
        runtime = inspect.getdoc(inspect.getattr_static(cls, member))
        assert runtime, f"{name}.{member} has no docstring"
        assert runtime == stub[member], f"{name}.{member}: the runtime docstring differs from the stub's"


def test_help_shows_signatures_and_the_version_is_the_installed_one() -> None:
    manager = encoder_cache.EncoderCacheManager
    assert str(inspect.signature(manager.can_allocate)) == (
        "(self, /, request, input_id, encoder_compute_budget, num_embeds_to_schedule)"
    )
    assert "num_embeds_to_schedule" in manager.can_allocate.__doc__
    from importlib.metadata import version

    assert encoder_cache.__version__ == version("encoder-cache")
    assert encoder_cache.__version__.count(".") == 2
