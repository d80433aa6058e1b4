"""`headrace` subcommands, one module each."""
