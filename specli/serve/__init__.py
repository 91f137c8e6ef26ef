"""`specli serve`: an OpenAI-compatible HTTP server over one loaded Speculator, with a chat page that shows
which tokens the draft got right. It imports the core; the core never imports it.

- protocol.py: OpenAI's request fields (as specli settings) and response shapes, llama-server's timings;
- worker.py: the one thread that owns the models and runs one generation at a time;
- app.py: the Starlette routes, the page, errors in OpenAI's shape;
- server.py: the socket, uvicorn, signals, the console lines.
"""
