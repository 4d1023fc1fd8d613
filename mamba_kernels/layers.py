"""The floors of the package, lowest first: a module may import only from its own floor or
below (tests/test_architecture.py checks it from the source; docs/ARCHITECTURE.md explains it)."""

LAYERS = ("facts", "runtime", "build", "install", "release", "cli")
