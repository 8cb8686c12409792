"""``PreprocessCfg`` (Pillow + numpy, what bundles and ``Backbone.preprocess`` run) against timm's evaluation
transform (what the pretrained weights were made for), on the odd images real data sets contain.

Decoding is shared: every path starts from :func:`edgecap.runtime.images.load.load_image`'s 8-bit RGB (CMYK, palettes,
16-bit, alpha on white, EXIF orientation), since timm's transform itself only takes an RGB image. The test checks
that decoding did the right thing for each odd input, then compares the tensors elementwise.

Measured (Pillow 11, torchvision 0.29, timm 1.0, numpy 2): max |PreprocessCfg - timm| = 0.0 on every image, for
every backbone config below (bicubic and bilinear, crop_pct 0.875 and 0.95, 64 to 224 px). That is why the bound is
exact equality, not a tolerance: both paths resize with Pillow's ``Image.resize`` (torchvision's ``Resize`` on a PIL
image calls it), crop at the same half-to-even rounded offsets as torchvision's ``CenterCrop`` (the 5×7 image is
upscaled first, as in timm), and normalise in float32 with the same correctly rounded IEEE operations in the same
order (``/ 255``, ``- mean``, ``/ std``), which leave no room for a difference. A resize outside Pillow (torch's
``interpolate``, OpenCV) would not be bit-identical and would fail here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

from edgecap.runtime.images.load import load_image
from edgecap.runtime.images.preprocess import PreprocessCfg
from edgecap.workshop.models.backbone import Backbone, create_backbone

_EXIF_ORIENTATION = 0x0112


def _pattern(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient plus noise and a red corner marker: resizing has detail to work on, rotations show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    noisy = np.clip(base + rng.integers(-40, 41, size=base.shape), 0, 255).astype(np.uint8)
    noisy[: max(1, height // 5), : max(1, width // 5)] = (255, 0, 0)
    return noisy


def _exif_jpeg(path: Path, upright: np.ndarray, orientation: int) -> None:
    """Store ``upright`` the way a camera would with ``orientation``: pixels rotated, the tag says how to undo it."""
    stored = Image.fromarray(upright)
    if orientation == 6:  # "rotate 90° clockwise to display": the sensor stored it 90° counter-clockwise
        stored = stored.transpose(Image.Transpose.ROTATE_90)
    elif orientation == 3:
        stored = stored.transpose(Image.Transpose.ROTATE_180)
    exif = Image.Exif()
    exif[_EXIF_ORIENTATION] = orientation
    stored.save(path, quality=100, subsampling=0, exif=exif)


def _write_odd_images(root: Path) -> dict[str, tuple[Path, object]]:
    """name -> (file, what decoding must give: an RGB array to match, or None when only the size is checked)."""
    images: dict[str, tuple[Path, object]] = {}
    rgb = _pattern(97, 71)

    cmyk = root / "cmyk.jpg"
    Image.fromarray(rgb).convert("CMYK").save(cmyk, quality=95)
    images["cmyk_jpeg"] = (cmyk, None)

    palette = Image.fromarray(rgb).quantize(colors=16)
    plain = root / "palette.png"
    palette.save(plain)
    images["palette_png"] = (plain, np.asarray(palette.convert("RGB")))

    transparent = root / "palette_transparent.png"
    palette.save(transparent, transparency=0)
    expected = np.asarray(palette.convert("RGB")).copy()
    expected[np.asarray(palette) == 0] = 255  # the transparent index shows the white page
    images["palette_png_transparency"] = (transparent, expected)

    gray16 = (np.arange(64 * 48, dtype=np.uint32).reshape(48, 64) * 21).astype(np.uint16)
    path16 = root / "gray16.png"
    Image.fromarray(gray16).save(path16)
    scaled = np.round(gray16.astype(np.float64) * 255 / 65535).astype(np.uint8)
    images["gray16_png"] = (path16, np.repeat(scaled[..., None], 3, axis=-1))

    alpha = np.where(np.arange(97)[None, :] < 40, 0, 255).astype(np.uint8).repeat(71, axis=0)
    rgba = root / "rgba.png"
    Image.fromarray(np.dstack([rgb, alpha])).save(rgba)
    images["rgba"] = (rgba, np.where(alpha[..., None] == 0, 255, rgb).astype(np.uint8))

    gray = rgb[..., 1]
    la = root / "la.png"
    Image.fromarray(np.dstack([gray, alpha]), mode="LA").save(la)
    images["la"] = (la, np.repeat(np.where(alpha == 0, 255, gray)[..., None], 3, axis=-1).astype(np.uint8))

    upright = _pattern(120, 80, seed=1)
    for orientation in (6, 3):
        path = root / f"exif{orientation}.jpg"
        _exif_jpeg(path, upright, orientation)
        images[f"exif_orientation_{orientation}"] = (path, ("approx", upright))

    bilevel = root / "bilevel.png"
    bits = (rgb[..., 0] > 128).astype(np.uint8) * 255
    Image.fromarray(bits).convert("1").save(bilevel)
    images["one_bit"] = (bilevel, np.repeat(bits[..., None], 3, axis=-1))

    for name, (width, height) in {"very_wide": (1200, 37), "very_tall": (29, 900), "tiny_5x7": (5, 7)}.items():
        pixels = _pattern(width, height, seed=width)
        path = root / f"{name}.png"
        Image.fromarray(pixels).save(path)
        images[name] = (path, pixels)

    grayscale = root / "gray.jpg"
    Image.fromarray(gray).save(grayscale, quality=95)
    images["grayscale"] = (grayscale, None)
    return images


@pytest.fixture(scope="module")
def odd_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    return _write_odd_images(tmp_path_factory.mktemp("odd-images"))


@pytest.fixture(
    scope="module", params=[("tf_efficientnet_lite0", 224), ("test_efficientnet", 64), ("test_resnet", 96)], ids=str
)
def backbone(request: pytest.FixtureRequest) -> Backbone:
    name, size = request.param
    torch.manual_seed(0)
    return create_backbone(name, pretrained=False, image_size=size)


def _timm_transform(backbone: Backbone):
    """timm's eval transform for the backbone's model, at the backbone's input size."""
    config = resolve_data_config({"input_size": (3, backbone.image_size, backbone.image_size)}, model=backbone.model)
    return create_transform(**config, is_training=False)


def test_the_config_is_the_one_timm_resolves_for_the_model(backbone: Backbone):
    config = resolve_data_config({"input_size": (3, backbone.image_size, backbone.image_size)}, model=backbone.model)
    cfg = backbone.preprocess_cfg
    assert cfg.mean == pytest.approx(config["mean"]) and cfg.std == pytest.approx(config["std"])
    assert (cfg.interpolation, cfg.crop_pct, cfg.crop_mode) == (
        config["interpolation"],
        config["crop_pct"],
        config["crop_mode"],
    )
    assert backbone.name in timm.list_models()


def test_odd_images_decode_as_documented(odd_images):
    for name, (path, expected) in odd_images.items():
        decoded = np.asarray(load_image(path))
        assert decoded.dtype == np.uint8 and decoded.ndim == 3 and decoded.shape[2] == 3, name
        if expected is None:
            continue
        if isinstance(expected, tuple):  # EXIF: upright again (a lossy JPEG, so close rather than equal)
            upright = expected[1]
            assert decoded.shape == upright.shape, name
            assert np.abs(decoded.astype(int) - upright).mean() < 4, name
            continue
        np.testing.assert_array_equal(decoded, expected, err_msg=name)


def test_preprocess_matches_timm_on_odd_images(odd_images, backbone: Backbone):
    """Elementwise against timm's transform of the same decoded image: measured max |diff| = 0.0, asserted exact."""
    reference = _timm_transform(backbone)
    for name, (path, _) in odd_images.items():
        expected = reference(load_image(path)).numpy()
        ours = backbone.preprocess_cfg(path)
        training = backbone.preprocess(path)[0].numpy()
        assert ours.shape == expected.shape == (3, backbone.image_size, backbone.image_size), name
        assert ours.dtype == np.float32, name
        diff = float(np.abs(ours - expected).max())
        assert diff == 0.0, f"{name}: max |PreprocessCfg - timm| = {diff:.3g}"
        np.testing.assert_array_equal(training, ours, err_msg=name)  # Backbone.preprocess is this very path


def test_preprocess_cfg_rebuilt_from_a_bundle_spec_is_identical(odd_images, backbone: Backbone):
    """Bundles carry the backbone spec, not the object: the config rebuilt from it preprocesses bit-identically."""
    spec = backbone.spec
    rebuilt = PreprocessCfg(
        image_size=int(spec["image_size"]),
        mean=tuple(spec["mean"]),
        std=tuple(spec["std"]),
        interpolation=spec["interpolation"],
        crop_pct=float(spec["crop_pct"]),
        crop_mode=spec["crop_mode"],
    )
    for name, (path, _) in odd_images.items():
        np.testing.assert_array_equal(rebuilt(path), backbone.preprocess_cfg(path), err_msg=name)
