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
            blocks += [
                textwrap.dedent(b)
                for b in re.findall(r"^( *)```python\n(.*?)^\1```", section, re.M | re.S)
                for b in [b[1]]
            ]
    return blocks


def test_readme_examples_are_found():
    blocks = readme_examples((REPO / "README.md").read_text(encoding="utf-8"))
    code = "\n".join(blocks)
    assert len(blocks) >= 2 and "convert_dataset(" in code and "ffload.Loader(" in code


WRONG_CALL = "import ffload\nloader = ffload.Loader(3.5, batch_size='256')\n"


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """mypy --strict's report on two user scripts in one run: the README's examples (after :data:`PRELUDE`),
    and :data:`WRONG_CALL`, which must fail. torch is not followed (``follow_imports = skip``: its values are
    ``Any`` to mypy): what is checked is ffload's public surface, and reading torch's stubs is two thirds of
    mypy's time (about 20 of 30 s on a 2-core machine)."""
    pytest.importorskip("mypy")
    tmp = tmp_path_factory.mktemp("mypy")
    (tmp / "readme_examples.py").write_text(
        PRELUDE + "\n".join(readme_examples((REPO / "README.md").read_text(encoding="utf-8"))), encoding="utf-8"
    )
    (tmp / "wrong_call.py").write_text(WRONG_CALL, encoding="utf-8")
    (tmp / "mypy.ini").write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n", encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(tmp / "mypy.ini"),
            "--strict",
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--no-incremental",
            "--cache-dir",
            str(tmp / "cache"),
            str(tmp / "readme_examples.py"),
            str(tmp / "wrong_call.py"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    return result.stdout


def test_readme_examples_pass_mypy_strict(mypy_report):
    assert [line for line in mypy_report.splitlines() if "readme_examples.py" in line] == []


def test_mypy_check_reports_a_type_error(mypy_report):
    """The check above can fail: wrong argument types through the lazy ``ffload.Loader`` are errors."""
    errors = [line for line in mypy_report.splitlines() if "wrong_call.py" in line and ": error:" in line]
    assert len(errors) == 2 and any('"batch_size"' in line for line in errors), mypy_report
