"""What a run has besides its model: checkpoints (``checkpoint``), the metrics rows and
their log lines (``metrics``), the anomaly checks and NaN rollback (``diagnostics``), the
reproducibility record (``reproduce``), and the TensorBoard/MLflow sinks (``sinks``).
Each is a small object the loop calls; each gets only its own section of the config."""
