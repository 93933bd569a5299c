"""`fwk serve`: exported ONNX models behind a KServe v2 (Open Inference Protocol) HTTP server.

models.py finds and loads exports (limits.py reads what their input can take from the
graph), batcher.py merges requests into batches, routing.py picks a version (stable,
canary), protocol.py parses and writes v2 bodies, app.py holds the routes and metrics,
front.py answers health checks and refusals before them (a Host not allowed, past
max_inflight), connections.py bounds the sockets uvicorn holds (header deadline, connection
cap), server.py starts uvicorn, warms up and drains on SIGTERM.
Nothing here imports torch.
"""
