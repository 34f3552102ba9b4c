"""Engines behind one interface (base.Engine); each engine in its own module."""
