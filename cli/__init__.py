"""The `tokenq` command line."""
