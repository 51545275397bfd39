"""Decoders: ``fields`` (text, labels, arrays... by extension), ``cpu`` (images), ``dali`` (GPU)."""
