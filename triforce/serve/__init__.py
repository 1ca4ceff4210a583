"""Serving: an OpenAI-compatible HTTP server (app.py) over one continuous batch (scheduler.py)."""
