"""Bundled example model files and their compiled profiles (goldens)."""
