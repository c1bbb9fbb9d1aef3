"""Layer 1: framework-free training utilities: learning-rate scaling and warm-up, class weights,
early stopping with atomic checkpoints, OCR label hygiene."""

from stoker.train.early_stopping import EarlyStopping
from stoker.train.lr import WarmupCosine, scale_lr, warmup_schedule
from stoker.train.text import LabelStats, label_stats, normalize_punctuation
from stoker.train.weights import class_weights

__all__ = [
    "EarlyStopping",
    "LabelStats",
    "WarmupCosine",
    "class_weights",
    "label_stats",
    "normalize_punctuation",
    "scale_lr",
    "warmup_schedule",
]
