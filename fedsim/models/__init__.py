"""Plain ``nn.Module`` models. Every constructor takes ``input_shape`` and ``num_classes``."""
