"""The one place the package version is written; setup.py and the packages read it."""

__version__ = "0.1.0"
