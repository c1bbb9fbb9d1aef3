"""Keras 3 runs on the torch backend here (CPU); the backend is chosen before keras loads."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")
