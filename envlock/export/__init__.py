"""Write a lock in the formats other tools read; one module per format (see cli.py)."""
