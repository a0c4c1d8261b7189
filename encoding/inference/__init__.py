"""encoding.inference: using a trained network and sharing it. A network back from its checkpoint, preset, model
folder or Hub id (:mod:`.loading`: :func:`load_model`, its :class:`ModelInfo`), its labels of any image
(:mod:`.predict`: :func:`segment`, :func:`inference_module`: whole / slide / multi-scale / flip), model folders and
the Hugging Face Hub (:mod:`.hub`), ``test.py``'s evaluation (:mod:`.evaluation`: :class:`EvaluationConfig`,
:func:`build_evaluation`) with its charts (:mod:`.evaluation_plots`) and error maps (:mod:`.error_maps`), and
``demo.py``'s work (:mod:`.demo`).

It sits above :mod:`encoding.engine` (it uses the engine's loops, checkpoint schema and builders; the engine never
imports it). ``encoding.load_model`` and ``encoding.segment`` are this package's. See ``docs/inference.md`` and
``docs/sharing.md``.
"""
from .loading import ModelInfo, load_model, model_info
from .predict import WindowBudget, inference_module, segment
from .hub import load_pretrained, push_to_hub, save_pretrained
from .evaluation import EvaluationConfig, build_evaluation, evaluation_module, read_image

__all__ = ["load_model", "ModelInfo", "model_info", "segment", "inference_module", "WindowBudget",
           "save_pretrained", "load_pretrained", "push_to_hub", "EvaluationConfig", "build_evaluation",
           "evaluation_module", "read_image"]
