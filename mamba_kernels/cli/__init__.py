"""Command line: one module per verb behind one entry point (``main``)."""
