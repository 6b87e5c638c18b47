"""The README's Python examples (its Convert and Load sections) type-check as a user's script under
``mypy --strict``: the lazy exports keep their types (``TYPE_CHECKING`` imports), ``py.typed`` ships, and the
public signatures are annotated. The examples' free names (a user's arrays and dataset) are declared first."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("Convert", "Load")  # the README sections whose examples use the public API

# what the examples leave to the user, declared with the types a user has
PRELUDE = """\
import numpy as np
import numpy.typing as npt
images_nhwc_uint8: npt.NDArray[np.uint8] = np.zeros((2, 32, 32, 3), np.uint8)
labels: npt.NDArray[np.int64] = np.zeros(2, np.int64)
my_dataset: list[tuple[npt.NDArray[np.uint8], int]] = []
"""


def readme_examples(text: str, sections: tuple[str, ...] = SECTIONS) -> list[str]:
    """The ```` ```python ```` blocks (dedented: some sit in list items) under the ``## <section>`` headings."""
    blocks = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        if section.splitlines()[0].strip() in sections:
            blocks += [textwrap.dedent(b) for b in re.findall(r"^( *)```python\n(.*?)^\1```", section, re.M | re.S)
                       for b in [b[1]]]
    return blocks


def test_readme_examples_are_found():
    blocks = readme_examples((REPO / "README.md").read_text(encoding="utf-8"))
    code = "\n".join(blocks)
    assert len(blocks) >= 2 and "convert_dataset(" in code and "ffload.Loader(" in code


def mypy_strict(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "readme_examples.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--ignore-missing-imports", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                           str(script)], capture_output=True, text=True, cwd=REPO, timeout=600)


def test_readme_examples_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy")
    code = PRELUDE + "\n".join(readme_examples((REPO / "README.md").read_text(encoding="utf-8")))
    result = mypy_strict(code, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_check_reports_a_type_error(tmp_path):
    """The check above can fail: a wrong argument type through the lazy ``ffload.Loader`` is an error."""
    pytest.importorskip("mypy")
    result = mypy_strict("import ffload\nloader = ffload.Loader(3.5, batch_size='256')\n", tmp_path)
    assert result.returncode == 1 and "batch_size" in result.stdout, result.stdout
