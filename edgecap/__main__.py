"""``python -m edgecap``: the command line, also the module torchrun launches (``torchrun ... -m edgecap train``)."""

from edgecap.cli import main

if __name__ == "__main__":
    main()
