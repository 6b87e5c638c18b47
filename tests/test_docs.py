"""The documentation's sources: the README stays a tour whose links resolve, and the vendored intersphinx
inventories are exactly what ``docs/_intersphinx/make_inventories.py`` writes (the site itself is built by
``.ci/run`` with ``sphinx-build -W -n``)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_is_a_tour_of_at_most_1500_words():
    prose = re.sub(r"```.*?```", "", README, flags=re.S)  # code blocks are not words to read
    assert len(prose.split()) <= 1500


def test_readme_local_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert any(t.startswith("docs/") for t in local)
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing


def test_vendored_inventories_are_the_generated_ones(tmp_path):
    soi = pytest.importorskip("sphobjinv")
    module = runpy.run_path(str(REPO / "docs" / "_intersphinx" / "make_inventories.py"))
    for stem, (project, version, objects) in module["INVENTORIES"].items():
        module["write"](tmp_path / f"{stem}.inv", project, version, objects)
        vendored = soi.Inventory(REPO / "docs" / "_intersphinx" / f"{stem}.inv")
        fresh = soi.Inventory(tmp_path / f"{stem}.inv")
        assert [o.as_str for o in vendored.objects] == [o.as_str for o in fresh.objects], stem
        assert vendored.count > 0
