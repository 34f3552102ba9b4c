"""Code that the API and the workers both import (no model, no engine)."""
