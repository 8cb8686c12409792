"""``step_mode`` through ``Captioner.load``: the static-cache step on a bundle gives the eager captions, and runtimes or
devices that cannot run a mode refuse it by name."""

from __future__ import annotations

import pytest

from edgecap import Captioner
from edgecap.runtime.captioner import CaptionerError
from tests.runtime.bundle.helpers import region_bundle

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def bundle_and_batch(tiny_data, tmp_path_factory):
    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.training.batches import FeatureBank

    data, feats = tiny_data
    records = load_dataset(data).split("test") + load_dataset(data).split("val")
    bank = FeatureBank(open_feature_source(feats), [r.image_id for r in records])
    return region_bundle(tiny_data, tmp_path_factory), bank.batch(list(range(len(records)))).as_inputs()


def test_static_step_mode_gives_the_eager_captions(bundle_and_batch):
    bundle, batch = bundle_and_batch
    with Captioner.load(bundle, runtime="torch", precision="fp32", device="cpu") as cap:
        assert cap.runtime_info["step_mode"] == "eager"
        expected = cap.caption_inputs(batch)
    assert any(expected)
    with Captioner.load(bundle, runtime="torch", precision="fp32", device="cpu", step_mode="static") as cap:
        assert cap.runtime_info["step_mode"] == "static"
        assert cap.caption_inputs(batch) == expected
    with Captioner.load(bundle, runtime="torch", precision="fp32", device="cpu", step_mode="auto") as cap:
        assert cap.runtime_info["step_mode"] == "eager"  # auto: a CUDA graph only on CUDA


def test_step_modes_the_runtime_or_device_cannot_run_are_refused(bundle_and_batch):
    bundle, _ = bundle_and_batch
    with pytest.raises(
        CaptionerError, match=r"'onnxruntime' runs its decoder step as \['eager'\], not step_mode='static'"
    ):
        Captioner.load(bundle, runtime="onnxruntime", step_mode="static")
    with pytest.raises(CaptionerError, match="needs a CUDA device"):
        Captioner.load(bundle, runtime="torch", device="cpu", step_mode="cuda-graph")
    with pytest.raises(CaptionerError, match="not step_mode='graph'"):
        Captioner.load(bundle, runtime="torch", device="cpu", step_mode="graph")
    with pytest.raises(CaptionerError, match=r"runtime 'torch-rerun' runs its decoder step as \['eager'\]"):
        Captioner.load(bundle, runtime="torch-rerun", device="cpu", step_mode="static")
