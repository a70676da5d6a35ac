"""Small real data sets for the lessons, shipped inside nbddp so a lesson trains offline, on CPU,
in seconds, on data whose loss and accuracy mean something (instead of synthetic regression).

``digits()``: 1,797 handwritten digits, 8x8 pixels each (the test set of the UCI "Optical
Recognition of Handwritten Digits" data, E. Alpaydin and C. Kaynak, 1998, CC BY 4.0; the copy
scikit-learn ships). See NOTICE.md beside this file.
"""
from __future__ import annotations

import gzip
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "digits.csv.gz")
DIGITS_TEST = 297  # the last rows: a fixed held-out split, the same on every rank and every run


def _digits_rows() -> list[list[int]]:
    with gzip.open(DIGITS, "rt", encoding="ascii") as f:
        return [[int(v) for v in line.split(",")] for line in f if line.strip()]


def digits(split: str = "all"):
    """``(images, labels)`` as torch tensors: images float32 of shape (N, 64), pixels scaled to 0..1;
    labels int64 0..9. ``split``: "train" (the first 1,500), "test" (the last 297) or "all"."""
    import torch

    rows = torch.tensor(_digits_rows(), dtype=torch.int64)
    images, labels = rows[:, :64].float() / 16.0, rows[:, 64].clone()
    where = {"all": slice(None), "train": slice(None, -DIGITS_TEST), "test": slice(-DIGITS_TEST, None)}
    if split not in where:
        raise ValueError(f"split is 'train', 'test' or 'all', not {split!r}")
    return images[where[split]], labels[where[split]]
