"""An RMSNorm kernel package and its pytest-h3 candidate (``candidate.py``)."""
