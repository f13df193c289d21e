"""``python -m vecpack.cli``: the ``vecpack`` command."""

from vecpack.cli.run import console

console()
