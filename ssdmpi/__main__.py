"""``python -m ssdmpi`` is the same as the ``ssdmpi`` console script."""

from ssdmpi.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
