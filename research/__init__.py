"""One-off studies behind numbers in ``docs/`` (``research/README.md``); run from the repository root as
``python -m research.NAME``."""
