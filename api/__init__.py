"""The `radixserve` command line and the OpenAI-compatible HTTP server (FastAPI + uvicorn)."""
