"""SegFormer: MiT-B0..B5 sizes, equality with Hugging Face transformers' SegFormer through the converter, exact data
parallelism, activation checkpointing, and a tiny training run (CPU, small inputs; nothing is downloaded: the
transformers models are built here at random init)."""
import csv
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (SegformerConfig, SegformerForImageClassification, SegformerForSemanticSegmentation)

import encoding
from encoding.models import convert_hf_segformer, get_mit, get_segmentation_model
from encoding.models.mit import MiTBlock
from encoding.nn import SegmentationLosses
from encoding.nn.recompute import is_checkpointed

from conftest import assert_replicated_step_is_exact, load_script, tiny_shapes_pair

#: The paper's parameter counts with 150 classes (millions).
PAPER_PARAMS = {"mit_b0": 3.8, "mit_b1": 13.7, "mit_b2": 27.5, "mit_b3": 47.3, "mit_b4": 64.1, "mit_b5": 84.7}
#: transformers' configuration of each variant tested against it: widths, depths, decoder width.
HF_SHAPES = {"mit_b0": ([32, 64, 160, 256], [2, 2, 2, 2], 256), "mit_b2": ([64, 128, 320, 512], [3, 4, 6, 3], 768)}


def hf_config(backbone, num_labels=150):
    widths, depths, decoder = HF_SHAPES[backbone]
    return SegformerConfig(hidden_sizes=widths, depths=depths, decoder_hidden_size=decoder, num_labels=num_labels)


def randomized_hf_segformer(backbone):
    """transformers' SegformerForSemanticSegmentation at random init, with random BatchNorm statistics, in eval."""
    torch.manual_seed(0)
    model = SegformerForSemanticSegmentation(hf_config(backbone))
    bn = model.decode_head.batch_norm
    bn.running_mean.normal_(0, 0.1)
    bn.running_var.uniform_(0.5, 1.5)
    bn.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def no_randomness(model):
    """Dropout and stochastic depth off (masks would differ between a split batch and the whole one)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model


@pytest.mark.parametrize("backbone", list(PAPER_PARAMS))
def test_parameter_counts_match_the_paper(backbone):
    with torch.device("meta"):  # no memory: only shapes
        model = get_segmentation_model("segformer", backbone=backbone, nclass=150)
    count = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(count - PAPER_PARAMS[backbone]) <= 0.1, count


@pytest.mark.parametrize("backbone, layout", [("mit_b0", "published-file"), ("mit_b2", "state-dict")])
def test_converted_weights_give_transformers_logits(backbone, layout, tmp_path):
    """Logits at stride 4 equal transformers' (fp32, 1e-4), and the output at input resolution equals its logits
    upsampled. B0 goes through a file in the published key layout (save_pretrained), B2 through a state dict in
    transformers 5's layout."""
    hf = randomized_hf_segformer(backbone)
    if layout == "published-file":
        hf.save_pretrained(tmp_path)
        source = tmp_path / "model.safetensors"
        model = get_segmentation_model("segformer", backbone=backbone, nclass=150, pretrained=source).eval()
    else:
        model = get_segmentation_model("segformer", backbone=backbone, nclass=150).eval()
        model.load_state_dict(convert_hf_segformer(hf.state_dict()))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        logits = model.classifier(*model.backbone(x))
        out = model(x)["out"]
    assert logits.shape == expected.shape == (2, 150, 16, 16)
    assert (logits - expected).abs().max() <= 1e-4
    upsampled = F.interpolate(expected, size=(64, 64), mode="bilinear", align_corners=False)
    assert out.shape == (2, 150, 64, 64) and (out - upsampled).abs().max() <= 1e-4


def test_encoder_checkpoint_loads_into_the_backbone(tmp_path):
    """An ImageNet encoder (SegformerForImageClassification, as nvidia/mit-b0) saved as a torch .bin: its
    classifier is dropped and the stage outputs equal transformers' hidden states."""
    torch.manual_seed(0)
    hf = SegformerForImageClassification(hf_config("mit_b0", num_labels=10)).eval()
    path = tmp_path / "pytorch_model.bin"
    torch.save(hf.state_dict(), path)
    assert not any(k.startswith("classifier") for k in convert_hf_segformer(str(path)))
    backbone = get_mit("mit_b0", pretrained=str(path)).eval()
    model = get_segmentation_model("segformer", backbone="mit_b0", nclass=3, pretrained_backbone=str(path))
    torch.testing.assert_close(model.backbone.state_dict(), backbone.state_dict(), rtol=0, atol=0)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = hf.segformer(x, output_hidden_states=True).hidden_states
        features = backbone(x)
    assert len(features) == len(expected) == 4
    for ours, theirs in zip(features, expected):
        assert (ours - theirs).abs().max() <= 1e-4


def test_converter_refuses_unmapped_keys_and_foreign_checkpoints():
    state = dict(SegformerForSemanticSegmentation(hf_config("mit_b0")).state_dict())
    state["decode_head.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"1 key\(s\) of the SegFormer checkpoint do not map: decode_head.extra"):
        convert_hf_segformer(state)
    del state["segformer.stages.0.blocks.0.attention.v_proj.weight"], state["decode_head.extra.weight"]
    with pytest.raises(ValueError, match=r"stages.0.blocks.0.attention.k_proj.weight \(keys and values"):
        convert_hf_segformer(state)
    with pytest.raises(ValueError, match="not a Hugging Face SegFormer checkpoint"):
        convert_hf_segformer({"conv1.weight": torch.zeros(1)})
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        convert_hf_segformer("nope.safetensors")


def test_pretrained_true_names_what_to_download_and_other_errors():
    with pytest.raises(ValueError, match=r"download nvidia/segformer-b2-finetuned-ade-512-512's pytorch_model.bin "
                                         r"or model.safetensors .* pretrained='path/to/that/file'") as err:
        get_segmentation_model("segformer", backbone="mit_b2", dataset="ade20k", pretrained=True)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"download nvidia/mit-b5's .* pretrained_backbone='path/to/that/file'"):
        get_segmentation_model("segformer", backbone="mit_b5", nclass=3, pretrained_backbone=True)
    with pytest.raises(ValueError, match="mit_b0 has output stride 32 only"):
        get_segmentation_model("segformer", backbone="mit_b0", nclass=3, output_stride=8)
    with pytest.raises(ValueError, match="unknown MiT backbone 'mit_b9'"):
        get_mit("mit_b9")


def test_segformer_b0_under_data_parallel_is_exact():
    """float64, 3 CPU replicas splitting 7 images 3/2/2, SyncBatchNorm in the decoder: loss, gradients and the
    decoder's BatchNorm statistics equal nn.BatchNorm2d on the whole batch."""
    torch.manual_seed(0)
    reference = no_randomness(get_segmentation_model("segformer", backbone="mit_b0", nclass=5)).double().train()
    synced = no_randomness(get_segmentation_model("segformer", backbone="mit_b0", nclass=5,
                                                  norm_layer=encoding.nn.SyncBatchNorm)).double().train()
    synced.load_state_dict(reference.state_dict())
    x = torch.randn(7, 3, 32, 32, dtype=torch.float64)
    target = torch.randint(-1, 5, (7, 32, 32))
    target[0, :28] = -1  # uneven valid pixels across replicas
    criterion = SegmentationLosses(nclass=5, ignore_index=-1)
    assert_replicated_step_is_exact(synced, reference, criterion, x, target, ["cpu"] * 3, [3, 2, 2], atol=1e-12)
    assert synced.classifier.fuse[1].num_batches_tracked == 1


def test_activation_checkpointing_recomputes_every_block_exactly():
    """recompute="backbone" wraps every MiT block; with stochastic depth and dropout on, one training step gives
    the gradients of the plain model (the recomputation replays the forward's masks)."""
    torch.manual_seed(0)
    plain = get_segmentation_model("segformer", backbone="mit_b0", nclass=4).train()
    checkpointed = get_segmentation_model("segformer", backbone="mit_b0", nclass=4, recompute="backbone").train()
    checkpointed.load_state_dict(plain.state_dict())
    blocks = [m for m in checkpointed.modules() if isinstance(m, MiTBlock)]
    assert len(blocks) == 8 and all(is_checkpointed(b) for b in blocks)
    x = torch.randn(2, 3, 32, 32)
    for model in (plain, checkpointed):
        torch.manual_seed(1)
        model(x)["out"].square().mean().backward()
    for (name, a), b in zip(checkpointed.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
    for a, b in zip(checkpointed.buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_train_script_learns_shapes_with_segformer_b0(shapes_root, tmp_path):
    """train.py --model segformer --backbone mit_b0 on the embedded shapes data: the loss falls over 2 epochs."""
    torch.manual_seed(0)
    out = tmp_path / "runs"
    argv = ["--model", "segformer", "--backbone", "mit_b0", "--crop-size", "32", "--base-size", "40",
            "--batch-size", "4", "--workers", "0", "--epochs", "2", "--no-val", "--lr", "0.001",
            "--output-dir", str(out)]
    load_script("train").main(argv, datasets=tiny_shapes_pair(shapes_root, num_train=16))
    with open(out / "shapes" / "segformer" / "default" / "log.csv", newline="") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    assert len(losses) == 2 and losses[1] < 0.9 * losses[0], losses


def test_train_options_take_an_encoder_file_and_keep_segformers_output_stride(tmp_path):
    """--pretrained-backbone FILE passes the file to the builder (heads at 10x); the shapes recipe's output stride 8
    belongs to its U-Net, so SegFormer keeps its own (32)."""
    options = load_script("options")
    path = str(tmp_path / "model.safetensors")
    open(path, "wb").close()  # there (checked before any work), not read by parsing
    args = options.parse_args(["--model", "segformer", "--backbone", "mit_b0", "--pretrained-backbone", path,
                               "--output-dir", str(tmp_path)])
    assert args.pretrained == path and args.head_lr_mult == 10.0 and args.output_stride is None
    assert options.parse_args(["--output-dir", str(tmp_path)]).output_stride == 8  # the recipe's own model
