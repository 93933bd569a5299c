"""The parts of a run besides its model. Each is a small object the loop calls, and each gets
only its own section of the config. They are the checkpoints in ``checkpoint``, the metrics
rows and their log lines in ``metrics``, the anomaly checks and NaN rollback in
``diagnostics``, the reproducibility record in ``reproduce`` and the TensorBoard and MLflow
sinks in ``sinks``."""
