"""``python -m lite_push`` and the ``lite-push`` command: see :mod:`lite_push.cli`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lite-push`` with ``argv`` (default ``sys.argv[1:]``); return
    the exit status."""
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
