"""`python -m slide` is the `slide` command (torchrun starts ranks so: `torchrun ... -m slide train`)."""

import sys

from slide.cli import main

if __name__ == "__main__":
    sys.exit(main())
