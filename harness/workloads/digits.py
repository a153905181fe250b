"""scikit-learn's bundled `digits` (1,797 8x8 greyscale digits, shipped inside the
package, no download) as an image set, split by a fixed rule: image i is held out
when i % 5 == 4 (359 validation images, 1,438 training images).

Pixels (0 to 16) are scaled to about zero mean and unit spread; the vision workloads
resize them to their image_size and repeat the grey channel (training_harness.workloads.data).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from training_harness.workloads.image_split import ImageSplit
from training_harness.workloads.optional import require

HELD_OUT_EVERY = 5


def digits_split() -> ImageSplit:
    datasets = require("sklearn.datasets", "digits")
    bunch = datasets.load_digits()
    pixels = np.asarray(bunch.images, dtype=np.float32)  # [N, 8, 8], 0..16
    labels = np.asarray(bunch.target, dtype=np.int64)
    digest = hashlib.sha256(pixels.tobytes() + labels.tobytes()).hexdigest()[:16]
    x = torch.from_numpy((pixels / 16.0 - 0.3) / 0.4).unsqueeze(1)  # mean ~0.3, spread ~0.4
    y = torch.from_numpy(labels)
    held = torch.arange(len(y)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
    return ImageSplit(train_x=x[~held], train_y=y[~held], val_x=x[held], val_y=y[held],
                      source="scikit-learn digits (8x8)", digest=digest)
