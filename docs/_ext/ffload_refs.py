"""Resolve references to ffload's own names that are not documented under that exact name.

Docstrings refer to names where the code defines them (``:class:`~ffload.loaders.loader.Loader```, or relative,
``:class:`shardio.ShardLayout```), while the API reference documents each public name once, under the namespace
a user imports it from (``ffload.Loader``). On a missing reference this extension imports the target (relative
targets are tried against the referring module and its parents), then links to the first of: the public name
that documents the object (or the nearest documented parent of an attribute), or the page of its defining module
(the format specifications); an internal helper that exists is shown as code without a link. A target that does not import stays unresolved, and ``sphinx-build -n -W`` fails on it:
a stale or misspelt name is caught, a reference to an internal helper is not an error.

Abbreviated third-party names (``np.``, ``npt.``) are expanded and handed to intersphinx.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from sphinx.ext import intersphinx

PUBLIC = (
    "ffload",
    "ffload.loaders",
    "ffload.decoders",
    "ffload.transforms",
    "ffload.formats",
    "ffload.convert",
    "ffload.convert.sources",
    "ffload.errors",
)
ABBREVIATIONS = {"np.": "numpy.", "npt.": "numpy.typing.", "nb.": "numba."}


def _locate(dotted: str):
    """(module name, attribute chain, object) for an importable dotted name, or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        modname = ".".join(parts[:i])
        try:
            obj = importlib.import_module(modname)
        except Exception:  # not a module (or a module that cannot import): try a shorter prefix
            continue
        chain = parts[i:]
        try:
            for name in chain:
                obj = getattr(obj, name)
        except Exception:
            return None
        return modname, chain, obj
    return None


def _search(target: str):
    """``target`` relative to any loaded ffload module (Sphinx's ``.name`` references and autosummary tables,
    which carry no context): the located object when every match is the same object, else None."""
    found = {}
    for modname in [m for m in sys.modules if m == "ffload" or m.startswith("ffload.")]:
        if (located := _locate(f"{modname}.{target}")) is not None:
            found.setdefault(id(located[2]), located)
    return next(iter(found.values())) if len(found) == 1 else None


def _instance_attribute(dotted: str):
    """``Class.name`` where ``name`` is set on instances (``self.name = ...``, an annotation): the class located."""
    head, _, name = dotted.rpartition(".")
    located = _locate(head) if head else None
    if located and inspect.isclass(located[2]):
        for klass in inspect.getmro(located[2]):
            try:
                source = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            if f"self.{name} =" in source or f"self.{name}:" in source or name in getattr(klass, "__annotations__", {}):
                return located
    return None


def _canonical(modname: str, chain: list[str]) -> tuple[str, list[str]]:
    """The defining module and qualified chain of ``modname.chain[0]`` (a re-exported class or function)."""
    if not chain:
        return modname, []
    top = getattr(importlib.import_module(modname), chain[0])
    if (inspect.isclass(top) or inspect.isfunction(top)) and "<" not in top.__qualname__:
        return top.__module__, [*top.__qualname__.split("."), *chain[1:]]
    return modname, chain


def _public_names() -> dict[str, list[str]]:
    """Defining ``module.qualname`` -> the public names that carry it."""
    names: dict[str, list[str]] = {}
    for namespace in PUBLIC:
        module = importlib.import_module(namespace)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                names.setdefault(f"{obj.__module__}.{obj.__qualname__}", []).append(f"{namespace}.{name}")
    return names


def _candidates(target: str, module: str | None, cls: str | None, source: str) -> list[str]:
    """``target`` as written, then relative to the page's current module and class, then relative to the object
    whose docstring holds the reference (autodoc names it in the node's source) and its parents."""
    out = [target]
    if module and cls:
        out.append(f"{module}.{cls}.{target}")
    origin = re.search(r"docstring of (\S+)", source or "")
    for context in (module, origin and origin.group(1)):
        if context:
            parts = context.split(".")
            out += [".".join(parts[:i]) + "." + target for i in range(len(parts), 0, -1)]
    return out


def missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    for short, full in ABBREVIATIONS.items():
        if target.startswith(short):
            node["reftarget"] = full + target[len(short) :]
            return intersphinx.missing_reference(app, env, node, contnode)
    located = None
    candidates = [c for c in _candidates(target, node.get("py:module"), node.get("py:class"), node.source)]
    for find in (_locate, _instance_attribute):
        for candidate in candidates:
            if candidate.startswith("ffload") and (located := find(candidate)):
                break
        if located:
            break
    located = located or _search(target)
    if not located:
        return None
    domain = env.get_domain("py")
    if not hasattr(env, "_ffload_public"):
        env._ffload_public = _public_names()
    modname, chain = (located[2].__name__, []) if inspect.ismodule(located[2]) else _canonical(*located[:2])
    for depth in range(len(chain), 0, -1):  # the object, then its documented parents (an undocumented attribute)
        head, rest = ".".join(chain[:1]), chain[1:depth]
        qual = ".".join(chain[:depth])
        names = [f"{modname}.{qual}"]
        for public in env._ffload_public.get(f"{modname}.{head}", ()):
            names.append(".".join([public, *rest]))
        for name in names:
            if name in domain.objects:
                return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", name, node, contnode)
    if modname in domain.modules:
        return domain.resolve_xref(env, node["refdoc"], app.builder, "mod", modname, node, contnode)
    return contnode  # an internal name that exists: shown as code, without a link


OPERATION_HOOKS: set[str] | None = None


def skip_operation_hooks(app, what, name, obj, skip, options):
    """Decoder and transform pages show what a user calls; the Operation hooks (``declare``, ``generate_code``,
    ...) are documented once, on :class:`ffload.loaders.Operation`."""
    global OPERATION_HOOKS
    if OPERATION_HOOKS is None:
        from ffload.loaders.pipeline.operation import Operation

        OPERATION_HOOKS = {n for n in vars(Operation) if not n.startswith("__")}
    if what == "class" and name in OPERATION_HOOKS:
        qualname = getattr(obj, "__qualname__", "")
        if not qualname.startswith("Operation."):
            return True
    return None


def setup(app):
    app.connect("missing-reference", missing_reference, priority=900)
    app.connect("autodoc-skip-member", skip_operation_hooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
