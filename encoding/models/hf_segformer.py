"""Hugging Face ``transformers`` SegFormer checkpoints -> this package's SegFormer / MiT state dicts.

Downloading stays the user's act: :func:`convert_hf_segformer` reads a local file (``pytorch_model.bin`` with
``torch.load(weights_only=True)``, or ``model.safetensors``) or takes a state dict, of

* ``SegformerForSemanticSegmentation`` (e.g. ``nvidia/segformer-b0-finetuned-ade-512-512``): encoder and all-MLP
  decoder -> ``backbone.*`` and ``classifier.*`` of ``get_segmentation_model("segformer", backbone="mit_b0")``;
* ``SegformerForImageClassification`` / ``SegformerModel`` (the ImageNet encoders ``nvidia/mit-b0`` ...): the encoder
  -> ``backbone.*`` (the ImageNet classifier ``classifier.*`` is dropped).

Both key layouts are read: the published files' (``segformer.encoder.block.0.0.attention.self.query...``, transformers
4) and transformers 5's (``segformer.stages.0.blocks.0.attention.q_proj...``). Every key must map: the error lists
those that do not.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Tuple, Union

import torch
from torch import Tensor

from ..utils.checkpoint import read_state_dict

__all__ = ["HF_SEGFORMER_ADE", "HF_MIT", "convert_hf_segformer", "is_hf_segformer", "read_segformer_weights",
           "hf_download_hint"]

#: Backbone -> the Hugging Face ADE20K checkpoint of the whole SegFormer (150 classes, 512 x 512 crops).
HF_SEGFORMER_ADE = {f"mit_b{i}": f"nvidia/segformer-b{i}-finetuned-ade-{size}-{size}"
                    for i, size in enumerate((512, 512, 512, 512, 512, 640))}
#: Backbone -> the Hugging Face ImageNet-1k checkpoint of the encoder.
HF_MIT = {f"mit_b{i}": f"nvidia/mit-b{i}" for i in range(6)}

Source = Union[str, os.PathLike, Mapping[str, Tensor]]

#: transformers 4 names (the published files) -> transformers 5 names, applied in order (as transformers does).
_TO_V5: List[Tuple[str, str]] = [
    (r"encoder\.patch_embeddings\.(\d+)\.", r"stages.\1.patch_embeddings."),
    (r"encoder\.block\.(\d+)\.", r"stages.\1.blocks."),
    (r"encoder\.layer_norm\.(\d+)\.", r"stages.\1.layer_norm."),
    (r"attention\.self\.query\.", "attention.q_proj."),
    (r"attention\.self\.key\.", "attention.k_proj."),
    (r"attention\.self\.value\.", "attention.v_proj."),
    (r"attention\.self\.sr\.", "attention.sequence_reduction.sequence_reduction."),
    (r"attention\.self\.layer_norm\.", "attention.sequence_reduction.layer_norm."),
    (r"attention\.output\.dense\.", "attention.o_proj."),
    (r"mlp\.dense1\.", "mlp.fc1."), (r"mlp\.dense2\.", "mlp.fc2."),
    (r"layer_norm_1\.", "layernorm_before."), (r"layer_norm_2\.", "layernorm_after."),
    (r"decode_head\.linear_c\.", "decode_head.linear_projections."),
]
#: transformers 5 names -> ours (``{i}`` a stage, ``{j}`` a block).
_TO_OURS: List[Tuple[str, str]] = [
    (r"stages\.(\d+)\.patch_embeddings\.proj\.", r"backbone.layers.\1.patch_embed.proj."),
    (r"stages\.(\d+)\.patch_embeddings\.layer_norm\.", r"backbone.layers.\1.patch_embed.norm."),
    (r"stages\.(\d+)\.layer_norm\.", r"backbone.layers.\1.norm."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.layernorm_before\.", r"backbone.layers.\1.blocks.\2.norm1."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.layernorm_after\.", r"backbone.layers.\1.blocks.\2.norm2."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.attention\.q_proj\.", r"backbone.layers.\1.blocks.\2.attn.q."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.attention\.o_proj\.", r"backbone.layers.\1.blocks.\2.attn.proj."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.attention\.sequence_reduction\.sequence_reduction\.",
     r"backbone.layers.\1.blocks.\2.attn.sr."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.attention\.sequence_reduction\.layer_norm\.",
     r"backbone.layers.\1.blocks.\2.attn.sr_norm."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.fc1\.", r"backbone.layers.\1.blocks.\2.mlp.fc1."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.dwconv\.dwconv\.", r"backbone.layers.\1.blocks.\2.mlp.dwconv."),
    (r"stages\.(\d+)\.blocks\.(\d+)\.mlp\.fc2\.", r"backbone.layers.\1.blocks.\2.mlp.fc2."),
    (r"decode_head\.linear_projections\.(\d+)\.proj\.", r"classifier.proj.\1."),
    (r"decode_head\.linear_fuse\.", "classifier.fuse.0."),
    (r"decode_head\.batch_norm\.", "classifier.fuse.1."),
    (r"decode_head\.classifier\.", "classifier.classifier."),
]
#: Keys and values of the attention, fused into our ``attn.kv`` (keys first).
_KV = re.compile(r"^(stages\.\d+\.blocks\.\d+\.attention)\.([kv])_proj\.(weight|bias)$")
#: The ImageNet classifier of ``nvidia/mit-b*`` (no counterpart in a segmentation model).
_IMAGENET_HEAD = re.compile(r"^classifier\.(weight|bias)$")


def _v5_name(key: str) -> str:
    key = key[len("segformer."):] if key.startswith("segformer.") else key
    for pattern, replacement in _TO_V5:
        key = re.sub(pattern, replacement, key)
    return key


def _our_name(key: str) -> Union[str, None]:
    for pattern, replacement in _TO_OURS:
        renamed, count = re.subn("^" + pattern, replacement, key)
        if count:
            return renamed
    return None


def is_hf_segformer(state: Mapping[str, Tensor]) -> bool:
    """Whether ``state`` holds Hugging Face SegFormer keys (``segformer.*`` / ``encoder.block.*`` / ``stages.*``)."""
    return any(re.match(r"^(segformer\.)?(encoder\.(block|patch_embeddings)|stages)\.\d", k) for k in state)


def convert_hf_segformer(source: Source) -> Dict[str, Tensor]:
    """Our SegFormer state dict from a Hugging Face ``transformers`` SegFormer checkpoint.

    Args:
        source: a local ``.bin`` / ``.pt`` file (read with ``weights_only=True``), a ``.safetensors`` file, or a
            state dict of ``SegformerForSemanticSegmentation``, ``SegformerForImageClassification`` or
            ``SegformerModel``.

    Returns:
        ``backbone.*`` (and, from a semantic-segmentation checkpoint, ``classifier.*``) keys of
        ``get_segmentation_model("segformer", backbone="mit_bN")``; linear decoder projections become 1x1 convs,
        keys and values are fused into ``attn.kv``.

    Raises:
        ValueError: keys that do not map (listed), or not a SegFormer checkpoint.

    Example:
        >>> state = convert_hf_segformer("segformer-b0-finetuned-ade-512-512/pytorch_model.bin")  # doctest: +SKIP
        >>> model.load_state_dict(state)  # doctest: +SKIP
    """
    where = repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else "the state dict"
    state = _read(source) if isinstance(source, (str, os.PathLike)) else source
    if not is_hf_segformer(state):
        raise ValueError(f"{where} is not a Hugging Face SegFormer checkpoint (no 'segformer.encoder.*' or "
                         "'segformer.stages.*' keys)")
    ours: Dict[str, Tensor] = {}
    kv: Dict[Tuple[str, str], Dict[str, Tensor]] = {}
    unmapped = []
    for key, value in state.items():
        name = _v5_name(key)
        match = _KV.match(name)
        if match:
            kv.setdefault((match[1], match[3]), {})[match[2]] = value
            continue
        if _IMAGENET_HEAD.match(key):
            continue
        target = _our_name(name)
        if target is None:
            unmapped.append(key)
            continue
        if target.startswith("classifier.proj.") and target.endswith(".weight"):
            value = value[:, :, None, None]  # Linear over tokens = 1x1 conv
        ours[target] = value
    for (attention, kind), parts in kv.items():
        if set(parts) != {"k", "v"}:
            unmapped.append(f"{attention}.{next(iter(parts))}_proj.{kind} (keys and values come in pairs)")
            continue
        query = _our_name(f"{attention}.q_proj.")  # backbone.layers.i.blocks.j.attn.q.
        ours[f"{query[:-2]}kv.{kind}"] = torch.cat([parts["k"], parts["v"]])
    if unmapped:
        raise ValueError(f"{where}: {len(unmapped)} key(s) of the SegFormer checkpoint do not map: "
                         f"{', '.join(sorted(unmapped)[:10])}{' ...' if len(unmapped) > 10 else ''}")
    return ours


def _read(path: Union[str, os.PathLike]) -> Mapping[str, Tensor]:
    if os.fspath(path).endswith(".safetensors"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"weights file not found: {os.fspath(path)!r}")
        try:
            from safetensors.torch import load_file
        except ImportError as err:  # installed with transformers; not a dependency of encoding
            raise ImportError(f"reading {os.fspath(path)!r} needs the safetensors package (pip install "
                              "safetensors), or pass the checkpoint's pytorch_model.bin instead") from err
        return load_file(os.fspath(path), device="cpu")
    return read_state_dict(path)


def read_segformer_weights(path: Union[str, os.PathLike]) -> Mapping[str, Tensor]:
    """The weights of a user's file for a SegFormer / MiT: a Hugging Face checkpoint (converted) or our own."""
    state = _read(path)
    return convert_hf_segformer(state) if is_hf_segformer(state) else state


def hf_download_hint(backbone: str, whole_model: bool = False) -> str:
    """The one-line error of ``pretrained=True`` for SegFormer / MiT: nothing downloads; what to fetch and pass."""
    if whole_model:
        what = f"SegFormer-{backbone[-2:].upper()} (ADE20K, 150 classes) weights: download {HF_SEGFORMER_ADE[backbone]}"
        option = "pretrained"
    else:
        what = f"{backbone} ImageNet weights: download {HF_MIT[backbone]}"
        option = "pretrained_backbone"
    return (f"{what}'s pytorch_model.bin or model.safetensors from the Hugging Face hub yourself (nothing downloads "
            f"here) and pass {option}='path/to/that/file' (converted on load by "
            "encoding.models.hf_segformer.convert_hf_segformer)")
