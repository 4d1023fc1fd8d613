"""Ground floor: the facts every layer reads (support table, label grammar, version keys, archs)."""
