"""memplan's REST service: HTTP in front of the library, and a persistent job queue for the device.

`uvicorn service.app:app` (or `memplan serve`) starts it. Nothing heavy is imported here: the app
module pulls in FastAPI, and torch is only ever imported by the job runner processes.
"""
