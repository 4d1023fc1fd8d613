"""Source builds: the plan, the architecture decision, the toolchain (setup.py stays a thin shell)."""
