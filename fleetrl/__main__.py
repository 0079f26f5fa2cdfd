"""`python -m fleetrl ...` is the same as the `fleetrl` command."""

from fleetrl.cli import main

if __name__ == "__main__":
    main()
