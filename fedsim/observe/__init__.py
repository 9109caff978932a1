"""What a run shows while it runs and leaves behind: the run logger (``metrics.jsonl``, TensorBoard, the
console), the metric records and their client rows, and the experiment trackers (MLflow, Weights & Biases).
It stores what the server hands it and decides nothing about the run."""
