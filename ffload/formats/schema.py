"""The JSON type and range of every value in the JSON documents ffload's formats store, checked in one place.

An LMDB dataset's metadata record (:mod:`.lmdb`) and a sharded dataset's manifest (:mod:`.shards`) are
JSON written by ffload, read back from files anyone may have edited. Their readers call :func:`check_document`
with the document's :data:`Schema` once, before using any value, so that a value of the wrong JSON type (a string
``record_size``, a list where an object belongs, ``true`` for an integer, a missing key, a negative count) is a
:class:`~ffload.errors.FormatError` naming the file, the key and what it should be, and never a ``ValueError`` or
``AttributeError`` from deep inside the reader. The fields' descriptors, shared by both documents, are checked by
:func:`check_field_specs` (their arguments by the field classes themselves, see :func:`.lmdb.descriptors.fields_from_specs`).
JSON types follow RFC 8259 as Python's :mod:`json` reads them (``true`` is not a number here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ffload.formats.fields.registry import FIELD_CLASSES
from ffload.formats.view import dataset_error

__all__ = ["Value", "Schema", "MAX_COUNT", "check_document", "check_field_specs", "FIELD_SPEC"]

MAX_COUNT = 2**63 - 1
"""The largest integer (in absolute value) a document may hold: an ``int64`` (sample counts and byte sizes
become numpy ``int64``/``uint64`` arrays)."""

_JSON_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


@dataclass(frozen=True)
class Value:
    """What one key of a JSON object must hold.

    Attributes:
        kinds: the Python types :mod:`json` gives for the JSON types allowed, matched exactly (``int`` is not
            ``bool``, nor ``float``).
        low, high: inclusive bounds of an integer (None: unbounded; every integer must fit an ``int64``
            besides, :data:`MAX_COUNT`, as counts and offsets become numpy arrays).
        choices: the values allowed (compared after the type check), or empty for any.
        required: whether the key must be present (an absent optional key reads as absent: ``doc.get(key)``).
        non_empty: a string or array that must not be empty.
    """

    kinds: tuple[type, ...]
    low: int | None = None
    high: int | None = None
    choices: tuple = ()
    required: bool = True
    non_empty: bool = False

    def describe(self) -> str:
        """What the value must be, in words (for error messages)."""
        if self.choices:
            return " or ".join(repr(c) for c in self.choices)
        what = " or ".join(_JSON_NAMES[k] for k in self.kinds)
        if self.low is not None and self.high is not None:
            return f"{what} in {self.low}..{self.high}"
        if self.low is not None:
            return f"{what} >= {self.low}"
        return f"a non-empty {what.removeprefix('a ').removeprefix('an ')}" if self.non_empty else what

    def problem(self, value: Any) -> bool:
        """Whether ``value`` (present) breaks the rule."""
        if type(value) not in self.kinds:  # exact types: bool is not an int
            return True
        if self.choices and value not in self.choices:
            return True
        if type(value) is int and (
            (self.low is not None and value < self.low)
            or abs(value) > MAX_COUNT
            or (self.high is not None and value > self.high)
        ):
            return True
        return self.non_empty and not value


Schema = dict[str, Value]
"""A JSON object's keys -> what each must hold; keys not listed are not read (and not checked)."""

FIELD_SPEC: Schema = {
    "name": Value((str,), non_empty=True),
    "type": Value((str,), choices=tuple(FIELD_CLASSES)),
    "type_id": Value((int,), low=0, high=255),
    "arguments": Value((dict,), required=False),
}
"""One field descriptor (:func:`.lmdb.descriptors.field_specs`); ``type_id`` must also be the type's own."""


def check_document(where: str, doc: Any, schema: Schema, what: str) -> dict:
    """``doc`` if it is a JSON object whose keys hold what ``schema`` says.

    Args:
        where: the file named in errors (path or URL).
        doc: the parsed JSON. what: the document's name in errors (``"metadata record"``, ``"manifest"``,
            ``"field 2 of the metadata record"``).
    Raises:
        FormatError: ``"<where>: <what>: <key> is <value>, expected <rule>"`` (or not an object, or a key missing).
    """
    if type(doc) is not dict:
        raise dataset_error(where, f"{what} is {_JSON_NAMES.get(type(doc), type(doc).__name__)}, expected an object")
    for key, rule in schema.items():
        if key not in doc:
            if rule.required:
                raise dataset_error(where, f"{what} lacks {key!r} ({rule.describe()})")
            continue
        if rule.problem(doc[key]):
            shown = repr(doc[key])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise dataset_error(where, f"{what}: {key!r} is {shown}, expected {rule.describe()}")
    return doc


def check_field_specs(where: str, specs: Any, what: str) -> list[dict]:
    """``specs``, the ``fields`` array of ``what``, if it holds at least one :data:`FIELD_SPEC` object, with
    unique names, each ``type_id`` the one of its ``type``. Raises FormatError naming ``where``, the field
    (its position and name) and the cause."""
    if type(specs) is not list or not specs:
        raise dataset_error(
            where,
            f"{what}: 'fields' is {_JSON_NAMES.get(type(specs), repr(specs))}, expected a "
            "non-empty array of field descriptors",
        )
    names: set[str] = set()
    for k, spec in enumerate(specs):
        check_document(where, spec, FIELD_SPEC, f"{what}: field {k}")
        name, cls = spec["name"], FIELD_CLASSES[spec["type"]]
        if name in names:
            raise dataset_error(where, f"{what}: field {k}: duplicate name {name!r}")
        names.add(name)
        if spec["type_id"] != cls.type_id:
            raise dataset_error(
                where,
                f"{what}: field {k} ({name!r}): type_id {spec['type_id']} is not the one of "
                f"{spec['type']} ({cls.type_id}): corrupt field type",
            )
    return specs
