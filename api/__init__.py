"""The HTTP API: thin FastAPI routes over Redis. Importing it never loads a model."""
