"""Choosing and installing a wheel: environment report, resolver, fetch, installer, sdist path, doctor."""
