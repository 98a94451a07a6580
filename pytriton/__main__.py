"""`python -m pytriton` runs the `pytriton` command."""

from pytriton.cli import main

main()
