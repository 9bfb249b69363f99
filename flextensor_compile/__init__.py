"""flextensor compiler: turns a PyTorch model into an offload profile, ahead of time (`ftc`).

Phases: discovery -> profiling (measurement) -> solve -> emit. The solver (`solve/`) is pure and
torch-free; the CLI (`cli/`) is thin and imports heavy modules inside commands.
"""

__version__ = "0.1.0"
