"""Imported at run time by every user: dispatch, the BUILD_INFO guard, knobs, ops, the install record."""
