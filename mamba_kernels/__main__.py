from .cli.main import program

raise SystemExit(program())
