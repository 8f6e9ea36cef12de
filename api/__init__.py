"""Command line and (later) the OpenAI-compatible HTTP server."""
