"""The fields' JSON descriptors (``name``, ``type``, ``type_id``, ``arguments``): the ``"fields"`` of
LMDB's metadata record (:mod:`ffload.formats.lmdb`) and of a sharded dataset's manifest (:mod:`..shards`),
written from the fields and read back into fields, each argument checked to read back unchanged."""

from __future__ import annotations

from ffload.formats.fields.base import Field
from ffload.formats.fields.registry import FIELD_CLASSES
from ffload.formats.schema import check_field_specs
from ffload.formats.view import dataset_error

__all__ = ["field_specs", "fields_from_specs"]


def field_specs(fields: dict[str, Field]) -> list[dict]:
    """The JSON descriptors of ``fields`` (``name``, ``type``, ``type_id``, ``arguments``), as
    LMDB's metadata record and a sharded dataset's manifest store them."""
    return [
        {"name": n, "type": type(f).__name__, "type_id": f.type_id, "arguments": f.arguments()}
        for n, f in fields.items()
    ]


def fields_from_specs(path: str, meta: dict, what: str = "manifest") -> dict[str, Field]:
    """The fields described by ``meta["fields"]`` (:func:`field_specs`), ``meta`` being ``what`` (the
    metadata record, a manifest): each descriptor checked (:func:`ffload.formats.schema.check_field_specs`), then its
    arguments by the field's constructor, and each argument given must read back as the same JSON value
    (``"12"`` for ``max_resolution``, ``true`` for a count, are refused rather than converted).

    Raises:
        DatasetError: naming ``path``, the field and the cause.
    """
    fields = {}
    for spec in check_field_specs(path, meta.get("fields"), what):
        name, args = spec["name"], spec.get("arguments", {})
        try:
            field = FIELD_CLASSES[spec["type"]].from_arguments(args)
        except (TypeError, ValueError, KeyError) as e:
            raise dataset_error(path, f"{what}: field {name!r}: invalid arguments {args!r} ({e})") from e
        kept = field.arguments()
        changed = [key for key in args if key in kept and not _same_json(args[key], kept[key])]
        if changed:
            raise dataset_error(
                path,
                f"{what}: field {name!r}: argument {changed[0]!r} is {args[changed[0]]!r}, "
                f"a {spec['type']} stores {kept[changed[0]]!r}",
            )
        fields[name] = field
    return fields


def _same_json(a, b) -> bool:
    """``a == b`` with the same JSON types throughout (``1 != True``, ``1 != 1.0``, ``"1" != 1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return a == b
