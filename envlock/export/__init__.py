"""Write a lock in the formats other tools read; one module per format (the command is envlock.commands.export)."""
