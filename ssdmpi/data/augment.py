"""Image augmentation, CIFAR convention: pad-and-random-crop and horizontal flip, seeded.

``Augment(pad=4, flip=True, seed=None)`` or the spec string ``"crop4,flip"``
(``parse_augment``): tokens ``cropN`` / ``crop=N`` / ``crop`` (N=4) and ``flip``,
comma-separated; ``""`` or ``"none"`` means no augmentation.

For each sample: zero-pad ``pad`` pixels on every side, cut a random H x W window
(offsets uniform in 0..2*pad, so the identity crop is one of them), then mirror
left-right with probability 1/2. It runs on already-normalised images, so the
padding value 0 is the per-channel mean colour (torchvision pads before
normalising, i.e. with black; the difference is immaterial for training and keeps
normalisation a one-time load step).

Randomness has no hidden stream: the draws of a global step are a pure function of
``(seed, epoch, step)`` (``draws``), one draw per sample of the global batch. So the
loader's position alone fixes them (save/restore, prefetch and the rank count do not
change what a given sample position sees), and rank r of W ranks sees exactly the
augmentation the single-process loader with batch W*B applies to the same samples.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ssdmpi.errors import UserError


@dataclasses.dataclass(frozen=True)
class Augment:
    """Pad-and-random-crop by ``pad`` pixels and/or random horizontal flip.

    ``seed`` None: the loader's seed is used (the streams differ from the permutation's).
    """

    pad: int = 4
    flip: bool = True
    seed: int | None = None

    def __post_init__(self):
        if int(self.pad) < 0:
            raise UserError(f"augmentation crop padding must be >= 0, got {self.pad}")

    @property
    def active(self) -> bool:
        return self.pad > 0 or self.flip

    def spec(self) -> str:
        """The spec string this augmentation parses from (``"crop4,flip"``)."""
        return ",".join(t for t in (f"crop{self.pad}" if self.pad else "", "flip" if self.flip else "") if t) or "none"

    @staticmethod
    def draws(seed: int, epoch: int, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Random numbers of global step ``step`` of ``epoch``: (uniform [0,1) offsets (n, 2), flips (n,) bool).

        Always the same amount drawn, whatever the settings, so one setting never shifts another's draws.
        """
        rng = np.random.default_rng([seed, epoch, step, 1])   # 4 words: never the permutation's 2-word stream
        return rng.random((n, 2)), rng.random(n) < 0.5

    def apply(self, images: np.ndarray, offsets: np.ndarray, flips: np.ndarray) -> np.ndarray:
        """Augment ``images`` (B, C, H, W) with the draws ``offsets`` (B, 2) and ``flips`` (B,); a new array."""
        n, _, h, w = images.shape
        p = int(self.pad)
        if p:
            padded = np.zeros(images.shape[:2] + (h + 2 * p, w + 2 * p), dtype=images.dtype)
            padded[:, :, p:p + h, p:p + w] = images
            shifts = np.minimum((offsets * (2 * p + 1)).astype(np.int64), 2 * p)
        else:
            padded, shifts = images, np.zeros((n, 2), dtype=np.int64)
        out = np.empty_like(images)
        for i in range(n):   # B slices beat one 4-D fancy-index gather for the usual B <= a few hundred
            dy, dx = shifts[i]
            window = padded[i, :, dy:dy + h, dx:dx + w]
            out[i] = window[:, :, ::-1] if (self.flip and flips[i]) else window
        return out


def parse_augment(spec, seed: int | None = None) -> Augment | None:
    """An ``Augment`` from a spec string (module docstring), an ``Augment``, or None; None when off."""
    if spec is None or isinstance(spec, Augment):
        return spec if spec is None or spec.active else None
    pad, flip = 0, False
    for token in (t.strip().lower() for t in str(spec).split(",")):
        if token in ("", "none"):
            continue
        if token == "flip":
            flip = True
        elif token.startswith("crop"):
            value = token[4:].lstrip("=") or "4"
            if not value.isdigit():
                raise UserError(f"bad augmentation '{token}' in '{spec}': "
                                "use cropN with N pixels of padding, e.g. crop4")
            pad = int(value)
        else:
            raise UserError(f"unknown augmentation '{token}' in '{spec}'; use crop4, flip or crop4,flip")
    aug = Augment(pad=pad, flip=flip, seed=seed)
    return aug if aug.active else None
