"""``import ffload``, ``ffload --help`` and every ``ffload CMD --help`` stay light: none of them imports OpenCV,
numba or torch (a fresh interpreter each, so nothing imported by other tests hides an import)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("cv2", "numba", "llvmlite", "torch")

PROBE = r"""
import json, sys
import click
from click.testing import CliRunner
import ffload
import ffload.cli

def commands(group, path):  # every command path under the group, the group itself first
    yield path
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            yield from commands(group.get_command(ctx, name), path + [name])

heavy = {"import": [m for m in HEAVY if m in sys.modules]}
for path in list(commands(ffload.cli.main, [])):
    result = CliRunner().invoke(ffload.cli.main, path + ["--help"])
    assert result.exit_code == 0, (path, result.output)
    heavy[" ".join(["ffload"] + path)] = [m for m in HEAVY if m in sys.modules]
print(json.dumps(heavy))
"""


def test_import_and_every_help_import_no_heavy_library():
    probe = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + PROBE], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert {"import", "ffload", "ffload convert", "ffload bench", "ffload recipe cifar10-resnet9"} <= set(found)
    assert all(modules == [] for modules in found.values()), found
