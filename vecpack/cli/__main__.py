"""``python -m vecpack.cli``: the ``vecpack`` command."""

import sys

from vecpack.cli.run import main

sys.exit(main())
