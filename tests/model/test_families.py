"""model/families: one registry of the families, each the owner of its facts. Their pixels' preprocessing
against transformers' own image processors (built offline with their defaults), what the data path
standardises with, the look-ups, and what InternViT's reader refuses by name."""

from __future__ import annotations

import io

import pytest

from mimo_jobs.model import families, hf, registry
from mimo_jobs.model.arch import ArchError, EncoderArch

transformers = pytest.importorskip("transformers")


def _processor(kind: str):
    """transformers' image processor of each vision family, with its defaults (no hub)."""
    T = transformers
    if kind == "internvit":
        # InternVL's own preprocessing (its dataset.py build_transform) is ImageNet's mean/std, which the
        # published InternVL "-hf" preprocessor_config.json states; transformers' GotOcr2ImageProcessor
        # defaults to CLIP's instead, so the constants are compared with transformers' ImageNet defaults
        from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        return {
            "image_mean": IMAGENET_DEFAULT_MEAN,
            "image_std": IMAGENET_DEFAULT_STD,
            "rescale_factor": 1 / 255,
        }
    proc = {"clip": T.CLIPImageProcessor, "siglip": T.SiglipImageProcessor}[kind]()
    return {k: getattr(proc, k) for k in ("image_mean", "image_std", "rescale_factor")}


@pytest.mark.parametrize("kind", ["clip", "siglip", "internvit"])
def test_each_vision_familys_pixels_are_its_image_processors(kind):
    px, want = families.vision(kind).pixels, _processor(kind)
    assert list(px.mean) == pytest.approx(list(want["image_mean"]), abs=0)
    assert list(px.std) == pytest.approx(list(want["image_std"]), abs=0)
    assert px.rescale == want["rescale_factor"]


def test_every_vision_family_is_tested_here_and_is_an_encoder_kind():
    image = {f.name for f in families.of_modality("image")}
    assert image == {"clip", "siglip", "internvit", "radio"}
    assert set(registry.kinds("image")) == image
    text = {f.name for f in families.of_modality("text")}
    assert text == {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"}


def _png(h: int, w: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["siglip", "internvit", "clip"])
def test_the_data_path_standardises_with_the_encoders_family(kind):
    """An image decoded for an encoder of each family equals transformers' processor's rescale + normalize
    of the same pixels (no resize: the image is already its one-piece size)."""
    import numpy as np
    import torch
    from PIL import Image

    from mimo_jobs.data.images import decode
    from mimo_jobs.model.tiling import ImageGeometry

    e = EncoderArch(kind, 1, 32, 4, 64, patch_size=4, image_size=16)
    data = _png(16, 16)
    x = decode(data, ImageGeometry.of(e))
    want = _processor(kind)
    with Image.open(io.BytesIO(data)) as im:
        raw = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32)).permute(2, 0, 1)
    mean, std = (
        torch.tensor(want[k], dtype=torch.float32).view(3, 1, 1) for k in ("image_mean", "image_std")
    )
    torch.testing.assert_close(x, (raw * want["rescale_factor"] - mean) / std, rtol=0, atol=1e-6)


def test_look_ups_name_what_is_known():
    assert hf.llm_family({"architectures": ["MixtralForCausalLM"]}) == "mixtral"
    assert hf.llm_family({"model_type": "qwen3"}) == "qwen3"
    assert families.of_config({"architectures": ["InternVLVisionModel"]}, "image").name == "internvit"
    with pytest.raises(ArchError, match="InternVLVisionModel") as e:
        families.of_config({"architectures": ["ViTModel"]}, "image")
    assert e.value.field == "architectures"
    with pytest.raises(ArchError, match="known: clip, internvit, radio, siglip"):
        families.vision("dino")


def _internvit(**over) -> dict:
    cfg = transformers.InternVLVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=16,
        patch_size=4,
        attention_bias=True,
    )
    return cfg.to_dict() | over


def test_internvit_reads_its_switches():
    e = EncoderArch(**hf.encoder_fields(_internvit()))
    assert (e.kind, e.class_token, e.layer_scale, e.pre_norm, e.final_norm) == (
        "internvit",
        True,
        True,
        False,
        False,
    )
    assert (e.image_size, e.patch_size, e.activation, e.norm_epsilon) == (16, 4, "gelu", 1e-6)
    assert EncoderArch(**hf.encoder_fields(_internvit(use_mean_pooling=False))).final_norm
    assert EncoderArch(**hf.encoder_fields(_internvit(norm_type="rms_norm"))).normalization == "RMSNorm"
    # a full InternVL config: its vision tower
    full = transformers.InternVLConfig(vision_config=_internvit()).to_dict()
    assert EncoderArch(**hf.encoder_fields(full)) == e


@pytest.mark.parametrize(
    "over, field, words",
    [
        ({"use_qk_norm": True}, "use_qk_norm", "per-head q/k norm"),
        ({"attention_bias": False}, "attention_bias", "biases the fused q/k/v"),
        ({"use_mask_token": True}, "use_mask_token", "mask token"),
        ({"use_absolute_position_embeddings": False}, "use_absolute_position_embeddings", "position table"),
        ({"image_size": [448, 224]}, "image_size", "square"),
        ({"norm_type": "rms_norm", "use_mean_pooling": False}, "use_mean_pooling", "one normalization"),
        ({"hidden_act": "relu"}, "hidden_act", "'relu'"),
    ],
)
def test_internvit_features_the_trainer_cannot_build_are_refused_by_name(over, field, words):
    with pytest.raises(ArchError, match=words) as e:
        hf.encoder_fields(_internvit(**over))
    assert e.value.field == field


@pytest.mark.parametrize("kind", ["clip", "siglip", "internvit"])
def test_a_vision_familys_token_rule_is_the_encoders(kind):
    # 64 x 48 px at patch 4 and a 2 x 2 pixel shuffle: 8 x 6 tokens, a class token (CLIP, InternViT) dropped
    e = EncoderArch(kind, 1, 32, 4, 64, patch_size=4, image_size=64, downsample=2)
    assert families.vision(kind).tokens_for(e, 64, 48) == e.tokens_for(64, 48) == 48


def test_run_yaml_records_layer_scale_only_where_it_is_set():
    """A field the encoder gained later is left out of trainer.model at its default (the run ids of every
    description without it stay as they were) and recorded where a family sets it."""
    from mimo_jobs.model.resolve import arch_of, resolved_field

    clip = resolved_field({"encoder": "clip-vit-l-14-336", "llm": "qwen3-8b"})
    assert "layer_scale" not in clip["encoder"]
    intern = resolved_field({"encoder": "internvit-300m-448", "llm": "qwen3-8b"})
    assert intern["encoder"]["layer_scale"] is True
    assert arch_of(intern).encoder == arch_of({"encoder": "internvit-300m-448", "llm": "qwen3-8b"}).encoder


def test_a_family_reads_and_writes_its_config_through_its_one_table():
    """A family is its config table: a CLIP-like tower under another name, built here from CLIP's class with
    nothing but its names changed, reads a config into the description and writes it back through the one
    table both ways (defaults, structure and all)."""
    from dataclasses import asdict, replace

    from mimo_jobs.model.families.clip import CLIP

    class Other(CLIP):
        architectures = ("OtherVisionModel",)
        vision_architecture = "OtherVisionModel"
        vision_model_type = "other_vision_model"

    fam = Other()
    cfg = {"architectures": ["OtherVisionModel"], "num_hidden_layers": 2, "hidden_size": 32}
    cfg |= {"num_attention_heads": 4, "intermediate_size": 64, "patch_size": 4, "image_size": 32}
    e = EncoderArch(**fam.fields(cfg))
    assert e.activation == "quick_gelu" and e.norm_epsilon == 1e-5 and e.channels == 3
    assert e.class_token and e.pre_norm and e.final_norm and not e.patch_bias
    back = fam.hf_config(e)
    assert back["model_type"] == "other_vision_model" and back["hidden_act"] == "quick_gelu"
    assert asdict(EncoderArch(**fam.fields(back))) == asdict(e)
    with pytest.raises(ArchError, match="pre_norm"):
        fam.hf_config(replace(e, pre_norm=False))  # the family's fixed structure is required on export


@pytest.mark.parametrize("kind", ["clip", "siglip", "internvit"])
def test_each_config_key_is_read_and_written_by_one_row(kind):
    """Every row of a family's table round-trips: a config with every key moved off its default reads to a
    description whose export writes the same keys back."""
    fam = families.vision(kind)
    cfg = fam.hf_config(EncoderArch(**fam.fields(_tiny_config(fam))))
    for k in fam.config_keys():
        assert k.hf in cfg, (kind, k.hf)
    again = fam.hf_config(EncoderArch(**fam.fields(cfg)))
    assert again == cfg


def _tiny_config(fam) -> dict:
    cfg = {"architectures": [fam.vision_architecture], "num_hidden_layers": 3, "hidden_size": 48}
    cfg |= {"num_attention_heads": 6, "intermediate_size": 96, "patch_size": 7, "image_size": 56}
    cfg |= {"num_channels": 1, "layer_norm_eps": 1e-3}
    return cfg | ({"attention_bias": True} if fam.name == "internvit" else {})


def test_a_new_vision_family_is_its_module(monkeypatch):
    """A vision family registered (here one whose rule adds an end-of-image token) is an encoder kind, and its
    token rule is what the description, the image geometry of the data path and the mock data count with:
    no list or rule elsewhere names it."""
    from mimo_jobs.data.mock import towers_of
    from mimo_jobs.model.arch import LLMArch, ModelArch, encoder_arch_from_dict
    from mimo_jobs.model.families.clip import CLIP
    from mimo_jobs.model.tiling import ImageGeometry

    class Ended(CLIP):
        name = "ended"
        architectures = ()

        def tokens_for(self, e, h_px, w_px):
            return super().tokens_for(e, h_px, w_px) + 1

    monkeypatch.setitem(registry.REGISTRY, Ended.name, Ended())
    e = EncoderArch("ended", 1, 32, 4, 64, patch_size=4, image_size=16)
    assert encoder_arch_from_dict(e.to_dict()) == e
    assert e.tokens_for(16, 8) == 4 * 2 + 1 and e.tokens_per_image == 17
    assert ImageGeometry.of(e).tokens(16, 16) == 17
    (tower,) = towers_of(ModelArch("m", e, LLMArch(1, 32, 4, 64, 128)))
    assert tower.tokens(side=16) == 17
    assert families.vision("ended").pixels == CLIP.pixels


def test_a_new_audio_family_is_an_audio_kind(monkeypatch):
    """An audio family registered is an AudioArch kind, read back from run.yaml's inline form as audio."""
    from mimo_jobs.model.arch import encoder_arch_from_dict
    from mimo_jobs.model.audio_arch import AudioArch
    from mimo_jobs.model.families.whisper import Whisper

    class Other(Whisper):
        name = "other_audio"
        architectures = ()

    monkeypatch.setitem(registry.REGISTRY, Other.name, Other())
    a = AudioArch("other_audio", 1, 32, 4, 64, num_mel_bins=8, max_source_positions=16)
    assert encoder_arch_from_dict(a.to_dict()) == a


def test_radio_has_clip_pixels_and_no_huggingface_form():
    """`radio`, the trainer's own ViT, is standardised as CLIP and refuses HuggingFace loading and export by
    name."""
    e = EncoderArch("radio", 1, 32, 4, 64, patch_size=4, image_size=16)
    assert families.vision("radio").pixels == families.vision("clip").pixels
    assert e.tokens_for(16, 16) == 16
    for call in (lambda: hf.encoder_config(e), lambda: hf.encoder_layout(e)):
        with pytest.raises(ArchError, match="'radio' has no HuggingFace form") as err:
            call()
        assert err.value.field == "kind"
