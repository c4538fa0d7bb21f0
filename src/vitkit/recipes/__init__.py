"""Built-in training recipes (YAML). List them with ``vitkit recipes``."""
