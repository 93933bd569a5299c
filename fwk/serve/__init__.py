"""`fwk serve`: exported ONNX models behind a KServe v2 (Open Inference Protocol) HTTP server.

models.py finds and loads exports, batcher.py merges requests into batches, routing.py
picks a version (stable, canary), protocol.py parses and writes v2 bodies, app.py holds
the routes and metrics, server.py starts uvicorn, warms up and drains on SIGTERM.
Nothing here imports torch.
"""
