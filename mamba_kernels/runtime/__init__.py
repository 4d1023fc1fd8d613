"""Imported at run time by every user: dispatch, BUILD_INFO guard, knobs, ops, arg checks, install record."""
