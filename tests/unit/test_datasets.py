"""nbddp.datasets: the real data the lessons train on is the published one, whole, in the package."""
from __future__ import annotations

import hashlib

import pytest

from nbddp import datasets


def test_digits_is_scikit_learns_copy_of_the_uci_test_set_byte_for_byte():
    """The file is the one NOTICE.md names (scikit-learn 1.9.1's sklearn/datasets/data/digits.csv.gz)."""
    assert hashlib.md5(open(datasets.DIGITS, "rb").read()).hexdigest() == "9b335364a7bfd63947c7480a5bd51f2d"


def test_digits_are_1797_images_of_64_pixels_with_every_digit_in_both_splits():
    import torch

    images, labels = datasets.digits()
    assert images.shape == (1797, 64) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.min() == 0 and images.max() == 1, "pixel counts 0..16 scaled to 0..1"
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    (train_x, train_y), (test_x, test_y) = datasets.digits("train"), datasets.digits("test")
    assert len(train_x) == 1500 and len(test_x) == 297
    assert torch.equal(torch.cat([train_x, test_x]), images) and torch.equal(torch.cat([train_y, test_y]), labels)
    assert set(test_y.tolist()) == set(range(10)) == set(train_y.tolist())
    with pytest.raises(ValueError, match="split is"):
        datasets.digits("validation")
