"""``python -m fastfeed`` is the ``fastfeed`` command."""

import sys

from fastfeed.cli import main

if __name__ == "__main__":
    sys.exit(main())
