"""Hardware backends of the model and its training: cpu (torch ops, gloo) and te (Transformer
Engine on NVIDIA GPUs), behind the protocol in base."""
