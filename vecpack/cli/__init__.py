"""The ``vecpack`` command line: ``pack``, ``inspect``, ``stats``, ``export``, ``cache``.

* :mod:`~vecpack.cli.run`: the arguments (validated by :mod:`vecpack.options`).
* :mod:`~vecpack.cli.commands`: what each command does.
* :mod:`~vecpack.cli.run`: :func:`main` (errors as one line) and :func:`console`, the console entry point.
* :mod:`~vecpack.cli.report`: what ``pack`` and ``stats`` print and draw.
"""

from vecpack.cli.run import build_parser as build_parser
from vecpack.cli.run import console as console
from vecpack.cli.run import main as main

__all__ = ["build_parser", "console", "main"]
