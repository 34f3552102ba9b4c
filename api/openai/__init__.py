"""OpenAI-compatible surface: wire models (protocol), logic (serving), files and batches."""
