"""Datasets (synthetic and torchvision), partitioners and the federated view of a dataset."""
