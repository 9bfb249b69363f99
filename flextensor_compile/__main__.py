"""`python -m flextensor_compile` runs the `ftc` command line."""

from flextensor_compile.cli.app import main

main()
