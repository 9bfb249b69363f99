"""The `ftc` command line: thin typer commands that parse, call the library, and render."""
