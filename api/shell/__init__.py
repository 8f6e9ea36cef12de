"""The HTTP shell's own routes and middleware: health, metrics, (de)tokenisation, the OpenAPI
document, auth, and the lifecycle (drain on SIGTERM, the watchdog)."""
