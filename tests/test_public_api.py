"""ffload's public namespaces: each lazy map (``_MODULES``, name -> defining module) is the one list of its
namespace, its ``if TYPE_CHECKING:`` block re-exports exactly those names from those modules (so checkers see
the types that ``__getattr__`` hides), and every public name imports, is documented with a one-line summary and
has annotated parameters."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

LAZY = [
    "ffload",
    "ffload.loaders",
    "ffload.decoders",
    "ffload.transforms",
    "ffload.loaders.decoders",
    "ffload.loaders.transforms",
    "ffload.convert",
]
PUBLIC = ["ffload", "ffload.loaders", "ffload.decoders", "ffload.transforms", "ffload.formats", "ffload.convert"]


def type_checking_imports(source: str) -> dict[str, str]:
    """Name -> module of the ``from module import Name as Name`` lines of the module-level ``if TYPE_CHECKING:``.

    Raises:
        AssertionError: another statement there, a name imported twice or not re-exported as itself.
    """
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.level == 0, ast.unparse(statement)
                for alias in statement.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export it as itself (`as {alias.name}`)"
                    assert alias.name not in found, f"{alias.name} imported twice"
                    found[alias.name] = statement.module or ""
    return found


def test_type_checking_imports_parses_and_refuses():
    source = "if TYPE_CHECKING:\n    from a.b import X as X\n    from c import Y as Y, Z as Z\nfrom d import W\n"
    assert type_checking_imports(source) == {"X": "a.b", "Y": "c", "Z": "c"}
    with pytest.raises(AssertionError, match="as X"):
        type_checking_imports("if TYPE_CHECKING:\n    from a import X\n")


@pytest.mark.parametrize("namespace", LAZY)
def test_type_checking_block_matches_the_lazy_map(namespace):
    module = importlib.import_module(namespace)
    with open(module.__file__, encoding="utf-8") as f:
        assert type_checking_imports(f.read()) == module._MODULES
    assert set(module.__all__) - {"__version__"} == set(module._MODULES)


@pytest.mark.parametrize("namespace", LAZY)
def test_lazy_map_names_the_defining_module(namespace):
    for name, where in importlib.import_module(namespace)._MODULES.items():
        assert getattr(importlib.import_module(where), name).__module__ == where, name


def test_one_list_per_namespace():
    """``ffload.decoders`` and ``ffload.transforms`` hold the lists; the implementation packages and
    ``ffload.loaders`` carry the same objects, and a name outside the maps is an AttributeError."""
    import ffload
    from ffload import decoders, loaders, transforms
    from ffload.loaders import decoders as loader_decoders
    from ffload.loaders import transforms as loader_transforms

    public = {**decoders._MODULES, **transforms._MODULES}
    assert public.items() <= loaders._MODULES.items()
    assert {**loader_decoders._MODULES, **loader_transforms._MODULES} == public
    assert all(where.startswith("ffload.loaders.decoders.") for where in decoders._MODULES.values())
    assert {"BoxCountDecoder", "MaskDecoder"} <= set(decoders.__all__)
    assert {"TransformBoxes", "FollowBoxes", "ToTensor", "ToDevice"} <= set(transforms.__all__)
    assert decoders.IntDecoder is loaders.IntDecoder is loader_decoders.IntDecoder
    assert transforms.FollowBoxes is loaders.FollowBoxes is loader_decoders.FollowBoxes
    assert ffload.Loader is loaders.Loader
    with pytest.raises(AttributeError, match="'ffload.transforms' has no attribute 'IntDecoder'"):
        transforms.IntDecoder  # noqa: B018


def public_objects() -> dict[str, object]:
    """``namespace.name`` -> object, for every public name of :data:`PUBLIC` (one entry per object)."""
    seen: dict[int, tuple[str, object]] = {}
    for namespace in PUBLIC:
        module = importlib.import_module(namespace)
        for name in module.__all__:
            if name != "__version__":
                obj = getattr(module, name)
                seen.setdefault(id(obj), (f"{namespace}.{name}", obj))
    return dict(seen.values())


def summary_problem(doc: str | None) -> str | None:
    """Why ``doc`` has no one-line summary (PEP 257: one line ending with a period, then a blank line), or None."""
    lines = (doc or "").splitlines()
    if not lines or not lines[0].strip():
        return "no docstring"
    if not lines[0].rstrip().endswith(".") or (len(lines) > 1 and lines[1].strip()):
        return f"first line is not a one-line summary: {lines[0]!r}"
    return None


def unannotated(obj: object) -> list[str]:
    """The parameters of a function (or of a class's own ``__init__``) without annotation, besides
    ``self``/``cls``/``*args``/``**kwargs``; ``return`` too for a function without return annotation."""
    function = obj.__init__ if inspect.isclass(obj) else obj
    if not inspect.isfunction(function):  # object.__init__, an Enum's: nothing of ffload's to annotate
        return []
    signature = inspect.signature(function)
    missing = [
        p.name
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.annotation is p.empty
    ]
    if not inspect.isclass(obj) and signature.return_annotation is signature.empty:
        missing.append("return")
    return missing


def test_summary_and_annotation_checks_fail_on_bad_input():
    def untyped(a, b: int, *args, **kwargs):
        """Wraps its first
        sentence."""

    assert summary_problem(untyped.__doc__).startswith("first line") and summary_problem(None) == "no docstring"
    assert summary_problem("One line.\n\n    More.") is None
    assert unannotated(untyped) == ["a", "return"]


def test_every_public_name_is_documented_and_annotated():
    objects = public_objects()
    assert len(objects) > 60
    problems = {name: summary_problem(inspect.getdoc(obj)) for name, obj in objects.items()}
    assert {name: why for name, why in problems.items() if why} == {}
    missing = {name: unannotated(obj) for name, obj in objects.items() if callable(obj)}
    assert {name: params for name, params in missing.items() if params} == {}
