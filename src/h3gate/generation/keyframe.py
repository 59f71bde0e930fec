"""The committed keyframe the fl2va workflow starts from, checked against its digest on every load.

A generation contract names this image by digest, so a silently edited file would change every fl2va generation
while the contract still reads the same; loading refuses any file whose sha256 differs.
"""

import hashlib
import io
from pathlib import Path

from PIL import Image

REFERENCE_IMAGE_SHA256 = "19b7c232e2416614c24d0ea253072636b337b2d7e845fffc426573e80b029f78"


def reference_image_path() -> Path:
    """The packaged 64x64 RGB PNG (gradients, a disc and a square; drawn with numpy, saved with Pillow)."""
    return Path(__file__).parent / "assets" / "reference_keyframe.png"


def load_reference_image(path: Path | None = None) -> Image.Image:
    """The reference keyframe as an RGB PIL image, from ``path`` (default: the packaged file) after checking that
    its sha256 is ``REFERENCE_IMAGE_SHA256``."""
    path = reference_image_path() if path is None else Path(path)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != REFERENCE_IMAGE_SHA256:
        raise ValueError(
            f"Reference image {path} has sha256 {digest}, expected {REFERENCE_IMAGE_SHA256}: restore the committed "
            "file (git checkout src/h3gate/generation/assets/reference_keyframe.png) rather than editing it."
        )
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")
