"""The ``click`` classes of ffload's commands: where an error becomes one line and an exit status.

Every command (``ffload ...``, and a recipe run on its own with ``python -m``) is a
:class:`FfloadCommand` or sits in a :class:`FfloadGroup`. Their ``invoke`` is the one place that
catches errors:

* :class:`~ffload.errors.FfloadError` -> ``ffload: error: <message>`` on stderr, exit status 1;
* ``OSError`` (permission denied, read-only folder, no such file) -> the same line naming the path;
* click's usage errors keep click's report and exit status 2;
* SIGTERM is handled like Ctrl-C (:func:`terminate_like_ctrl_c`): the exception unwinds, so that
  partial outputs are removed, then ``ffload: terminated (SIGTERM)`` and exit status 143
  (128 + 15, the shell's convention);
* ``ffload --debug ...`` prints the traceback before the line.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback

import click

from ffload.errors import FfloadError

__all__ = ["FfloadCommand", "FfloadGroup", "DEBUG_KEY", "Terminated", "error_line", "terminate_like_ctrl_c"]

DEBUG_KEY = "ffload.debug"
"""``ctx.meta`` key set by ``ffload --debug`` (``meta`` is shared by every sub-command's context)."""


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM (after
    :func:`terminate_like_ctrl_c`); a ``KeyboardInterrupt`` so that every Ctrl-C clean-up runs."""


def terminate_like_ctrl_c() -> None:
    """Make SIGTERM raise :class:`Terminated` in this process (main thread only; a no-op elsewhere).
    Forked children (encoding workers) that inherit the handler die of SIGTERM as by default."""
    if threading.current_thread() is not threading.main_thread():
        return
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def error_line(error: BaseException) -> str:
    """The one line reported for ``error``: ``ffload: error: <message>``, whitespace collapsed.

    An ``OSError`` is named by its path(s) and ``strerror`` (``<path>: Permission denied``), as the
    shell does; one without a path by its message.
    """
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        paths = [error.filename] + ([error.filename2] if error.filename2 is not None else [])
        message = f"{' -> '.join(map(str, paths))}: {error.strerror}"
    else:
        message = str(error) or type(error).__name__
    return "ffload: error: " + " ".join(message.split())


class _ReportsErrors:
    """Mixin for ``click.Command`` subclasses: ``invoke`` reports FfloadError / OSError in one line."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (FfloadError, OSError) as e:
            if ctx.meta.get(DEBUG_KEY):
                click.echo(traceback.format_exc(), err=True, nl=False)
            click.echo(error_line(e), err=True)
            ctx.exit(1)
        except Terminated:
            click.echo("ffload: terminated (SIGTERM); partial output removed", err=True)
            ctx.exit(143)


class FfloadCommand(_ReportsErrors, click.Command):
    """A ``click.Command`` whose errors are reported as the module docstring says."""


class FfloadGroup(_ReportsErrors, click.Group):
    """A ``click.Group`` reporting errors (also those of plain ``click.Command`` sub-commands); its
    ``@group.command()`` makes :class:`FfloadCommand` sub-commands.

    Args:
        lazy: sub-command name -> ``(module, attribute)``, imported only when the command runs (they
            import torch, which ``ffload convert`` / ``inspect`` do not need).
    """

    command_class = FfloadCommand

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx, name):
        if name in self._lazy:
            module, attr = self._lazy[name]
            return getattr(__import__(module, fromlist=[attr]), attr)
        return super().get_command(ctx, name)
