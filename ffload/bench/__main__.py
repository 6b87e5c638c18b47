"""``python -m ffload.bench PATH``: the ``ffload bench`` command."""

from __future__ import annotations

from .cli import bench_command

if __name__ == "__main__":
    bench_command()
