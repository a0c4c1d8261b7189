"""The planner's Python API: :func:`plan` simulates a model's training step under each strategy and returns a
:class:`MemoryPlan` (peaks per device, the split, :meth:`MemoryPlan.fits`, and with a memory limit the advice of
:func:`~encoding.memory.advice.advise`).

Example:
    >>> from encoding.memory import plan
    >>> result = plan(model, criterion, crop=64, batch=4, num_devices=2, strategies=("ddp", "fsdp"),
    ...               memory_limit="1GiB")  # doctest: +SKIP
    >>> result.fits(strategy="fsdp")  # doctest: +SKIP
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from ..config.groups import AMP_DTYPES
from ..nn.recompute import RECOMPUTE_POLICIES, checkpoint_segmentation_model, disable_checkpointing
from ..utils.renamed import renamed_keyword
from .advice import Advice, advise
from .balance import _fake_copy, _KeyedLoss, strategy_peaks
from .kernels import CpuKernels
from .program import BACKENDS, MEMORY_STRATEGIES, StepSpec, default_optimizer
from .simulate import Simulator
from .tracker import CUDA_BLOCK, MIB, Workspaces

__all__ = ["AMP_DTYPES", "MAX_DEVICE_MEMORY", "MemoryPlan", "plan", "parse_memory", "loop_name"]

#: ``amp=`` names and their autocast dtypes.

_UNITS = {"b": 1, "k": 2 ** 10, "kb": 10 ** 3, "kib": 2 ** 10, "m": 2 ** 20, "mb": 10 ** 6, "mib": 2 ** 20,
          "g": 2 ** 30, "gb": 10 ** 9, "gib": 2 ** 30, "t": 2 ** 40, "tb": 10 ** 12, "tib": 2 ** 40}


#: The most memory per device a plan accepts: more than any accelerator has (the largest hold under 300 GB), so
#: a larger limit is a typing error, not a device (``parse_memory(..., per_device=True)``).
MAX_DEVICE_MEMORY = "1TiB"


def parse_memory(text: Union[str, int], per_device: bool = False) -> int:
    """``"11GiB"`` -> bytes (an ``int`` is bytes already); the unit is required: B, KB/KiB, MB/MiB, GB/GiB,
    TB/TiB (K/M/G/T = binary). The one reader of memory sizes (the memory tool's options, :func:`plan`, the web
    page's Plan tab, ``segment(memory=...)``).

    Args:
        per_device: the memory of one device: more than :data:`MAX_DEVICE_MEMORY` is refused.

    Raises:
        ValueError: a number without a unit (``"11"`` is not 11 bytes nor 11 GiB), anything else, a size that is
            not positive, or with ``per_device`` one that no real device has.
    """
    import re

    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match and not unit:
            raise ValueError(f"memory size {text!r} has no unit; write e.g. {match.group(1)}GiB or "
                             f"{match.group(1)}MiB")
        if not match or unit not in _UNITS:
            raise ValueError(f"cannot read memory size {text!r}; write e.g. 11GiB, 11000MiB or 12GB")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    if per_device and value > parse_memory(MAX_DEVICE_MEMORY):
        raise ValueError(f"no real device has {text} of memory (a plan takes at most {MAX_DEVICE_MEMORY} per "
                         "device)")
    return value


def loop_name(keep_outputs: bool) -> str:
    """The training loop a report simulated, in words."""
    return ("keep-outputs (outputs = model(x); loss = criterion(outputs, y); loss.backward())" if keep_outputs
            else "train.py (criterion(model(x), y).backward(): outputs freed before backward)")


@dataclass
class MemoryPlan:
    """What :func:`plan` found.

    Attributes:
        peaks: strategy -> peak bytes per device (rank).
        splits: strategy -> samples per device.
        batch: the total batch; crop: the square crop; num_devices: devices (ranks).
        keep_outputs: which loop was simulated (see :func:`loop_name`).
        amp: ``None``, ``"bf16"`` or ``"fp16"``.
        recompute: the activation-recomputation policy of the peaks.
        memory_limit: bytes per device, or ``None``.
        advice: with a memory limit, per strategy x policy the largest batch and crop that fit, one row marked
            recommended (:class:`~encoding.memory.advice.Advice`).
    """

    peaks: Dict[str, List[int]]
    splits: Dict[str, List[int]]
    batch: int
    crop: int
    num_devices: int
    keep_outputs: bool = False
    amp: Optional[str] = None
    recompute: str = "none"
    memory_limit: Optional[int] = None
    advice: List[Advice] = field(default_factory=list)

    @property
    def loop(self) -> str:
        """The simulated training loop, in words."""
        return loop_name(self.keep_outputs)

    @property
    def recommended(self) -> Optional[Advice]:
        """The recommended row of the advice (``None`` without a limit, or when nothing fits)."""
        return next((row for row in self.advice if row.recommended), None)

    def peak_mib(self, strategy: str) -> List[float]:
        """Peaks per device of ``strategy`` in MiB."""
        return [round(p / MIB, 2) for p in self._peaks(strategy)]

    def fits(self, device: Optional[int] = None, strategy: Optional[str] = None,
             memory_limit: Union[str, int, None] = None) -> bool:
        """Whether ``device`` (every device when ``None``) of ``strategy`` (required when several were planned)
        stays within ``memory_limit`` (default: the plan's).

        Raises:
            ValueError: no limit, an unknown strategy or device, or several strategies and none named.
        """
        limit = parse_memory(memory_limit) if memory_limit is not None else self.memory_limit
        if limit is None:
            raise ValueError("fits: no memory limit; pass memory_limit= here or to plan()")
        peaks = self._peaks(strategy)
        if device is not None and not 0 <= device < len(peaks):
            raise ValueError(f"fits: device {device} is not one of the {len(peaks)} planned devices")
        return all(p <= limit for p in (peaks if device is None else [peaks[device]]))

    def _peaks(self, strategy: Optional[str]) -> List[int]:
        if strategy is None:
            if len(self.peaks) != 1:
                raise ValueError(f"several strategies were planned ({', '.join(self.peaks)}); name one: "
                                 "strategy=...")
            strategy = next(iter(self.peaks))
        if strategy not in self.peaks:
            raise ValueError(f"strategy {strategy!r} was not planned; planned: {', '.join(self.peaks)}")
        return self.peaks[strategy]


def _policy_model(model: nn.Module, policy: str) -> Callable[[], nn.Module]:
    """Builds, inside the simulator's fake mode, a fake copy of ``model`` with checkpointing ``policy``."""
    def build() -> nn.Module:
        from torch._guards import detect_fake_mode

        copy = disable_checkpointing(_fake_copy(model, detect_fake_mode()))
        return checkpoint_segmentation_model(copy, policy) if policy != "none" else copy
    return build


def _segmentation_sample(size: int, in_channels: int) -> Tuple[Callable[[int], Tuple[tuple, dict]],
                                                                Callable[[int], Tensor]]:
    """The default sample: ``share`` square images and their ``int64`` label maps."""
    return (lambda share: ((torch.zeros(share, in_channels, size, size),), {}),
            lambda share: torch.zeros(share, size, size, dtype=torch.long))


def _as_call(inputs: Any) -> Tuple[tuple, dict]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return (tuple(inputs) if isinstance(inputs, tuple) else (inputs,)), {}


def _custom_sample(sample: Callable[[int], Tuple[Any, Any]]) -> Tuple[Callable[[int], Tuple[tuple, dict]],
                                                                      Callable[[int], Any]]:
    """``make_inputs`` / ``make_target`` of ``sample(n) -> (inputs, targets)``; one call per share (the targets
    of a detector live inside its inputs: both come from the same batch)."""
    cache: Dict[int, Tuple[Any, Any]] = {}

    def batch_of(share: int) -> Tuple[Any, Any]:
        if share not in cache:
            cache.clear()
            cache[share] = sample(share)
        return cache[share]

    def make_target(share: int) -> Any:
        targets = batch_of(share)[1]
        cache.clear()  # the next step draws a fresh batch (no tensor of this one outlives its step)
        return targets

    return (lambda share: _as_call(batch_of(share)[0])), make_target


def plan(model: nn.Module, criterion: Callable[..., Any], *, batch: int, num_devices: int,
         crop: Optional[int] = None, sample: Optional[Callable[[int], Tuple[Any, Any]]] = None,
         output_key: Optional[Hashable] = None, aux_weight: Optional[float] = None,
         strategies: Sequence[str] = ("balanced",), keep_outputs: bool = False, amp: Optional[str] = None,
         recompute: str = "none", memory_limit: Union[str, int, None] = None, in_channels: int = 3,
         optimizer: Callable[[List[Tensor]], torch.optim.Optimizer] = default_optimizer,
         round_to: int = CUDA_BLOCK, backend: str = "nccl", workspaces: Optional[Workspaces] = None,
         **old: Any) -> MemoryPlan:
    """Simulate a training step of ``model`` (on fake tensors: nothing is allocated, the model is not changed)
    under each strategy on ``num_devices`` devices.

    Args:
        model: the network; its outputs (a tensor, dict or tuple; ``output_key`` picks one) go to ``criterion``
            with the target of ``sample`` (default: an ``int64`` target of the input's batch and spatial size).
            ``recompute`` other than ``"none"`` needs a :class:`~encoding.models.SegmentationModel`.
        criterion: ``criterion(outputs, target)``.
        batch: total batch (split evenly; ``balanced-auto`` plans its own split).
        crop: square input size of the default segmentation sample (``B x in_channels x crop x crop`` images,
            ``B x crop x crop`` labels); not used with ``sample``.
        sample: ``sample(n) -> (inputs, targets)``: one batch of ``n`` samples of any shape, for any model and
            task — ``inputs`` a tensor, a tuple of positional arguments or a dict of keyword arguments (e.g. a
            detector's ``(list_of_images, list_of_target_dicts)``), ``targets`` what ``criterion`` takes beside the
            output (e.g. a classifier's ``(n,)`` labels; ``None`` for a model that returns its losses). It is called
            inside the simulator, so its tensors are fake (nothing is allocated). With ``sample``, a
            ``memory_limit`` is kept for :meth:`MemoryPlan.fits` but gives no advice (that searches crops).
        output_key: the key (or index) of the output ``criterion`` receives (e.g. ``"out"`` for torchvision's
            segmentation models); with ``aux_weight``, ``aux_weight * criterion(output["aux"], target)`` is added.
        aux_weight: the weight of the auxiliary loss (needs ``output_key``).
        num_devices: devices (ranks).
        strategies: from :data:`~encoding.memory.program.MEMORY_STRATEGIES`.
        keep_outputs: simulate the loop that holds the outputs through backward (default: ``train.py``'s).
        amp: ``None``, ``"bf16"`` or ``"fp16"`` autocast for forward and loss.
        recompute: activation recomputation of the peaks: ``"none"``, ``"backbone"`` or ``"all"`` (``checkpoint=``,
            its old name, warns).
        memory_limit: bytes per device (``int``) or a size such as ``"24GiB"``; with it, :attr:`MemoryPlan.advice`
            (every checkpointing policy for a :class:`~encoding.models.SegmentationModel`, else ``"none"`` only),
            simulated with the peaks' kernel buffers (``workspaces``, ``backend="gloo"``'s) where there are any.
        in_channels: input channels.
        optimizer: ``params -> optimizer`` (default: SGD with momentum and weight decay).
        round_to: allocation granularity (512: CUDA's blocks; 1: the CPU's).
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPU processes): what the collectives of ``fsdp`` ranks hold;
            with ``"gloo"`` the CPU kernels' own buffers are added, each distinct convolution probed for real once
            (:class:`~encoding.memory.kernels.CpuKernels`).
        workspaces: kernels' workspaces learned from real steps
            (:func:`~encoding.memory.profiler.learn_workspaces`) added to the peaks; default none.

    Raises:
        ValueError: an unknown strategy, policy or ``amp``, a batch smaller than the devices, a bad limit.
    """
    recompute = renamed_keyword(old, "checkpoint", "recompute", recompute, "plan")
    unknown = [s for s in strategies if s not in MEMORY_STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"plan: unknown strategies {unknown or 'none given'}; valid: {', '.join(MEMORY_STRATEGIES)}")
    if recompute not in RECOMPUTE_POLICIES:
        raise ValueError(f"plan: recompute={recompute!r}; valid: {', '.join(RECOMPUTE_POLICIES)}")
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(f"plan: amp={amp!r}; valid: {', '.join(AMP_DTYPES)} or None")
    if (sample is None) == (crop is None):
        raise ValueError("plan: give crop= (the default segmentation sample) or sample= (any batch), not both")
    if min(crop or 1, num_devices) < 1 or batch < num_devices:
        raise ValueError(f"plan: needs crop >= 1, num_devices >= 1 and batch >= num_devices, got crop={crop}, "
                         f"num_devices={num_devices}, batch={batch}")
    if aux_weight and output_key is None:
        raise ValueError("plan: aux_weight needs output_key (e.g. output_key='out', aux_weight=0.5)")
    limit = None if memory_limit is None else parse_memory(memory_limit, per_device=True)
    loss = criterion if output_key is None else _KeyedLoss(criterion, output_key, "aux", aux_weight)

    def spec_for(size: int, policy: str) -> StepSpec:
        make_inputs, make_target = (_segmentation_sample(size, in_channels) if sample is None
                                    else _custom_sample(sample))
        return StepSpec(build_model=_policy_model(model, policy), make_inputs=make_inputs, make_target=make_target,
                        criterion=loss, optimizer=optimizer, amp_dtype=AMP_DTYPES.get(amp),
                        keep_outputs=keep_outputs)

    if backend not in BACKENDS:
        raise ValueError(f"plan: backend={backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "gloo":  # CPU processes: the CPU kernels' own buffers, probed
        workspaces = CpuKernels(workspaces)
    simulator = Simulator(spec_for(crop or 0, recompute), round_to, backend=backend, workspaces=workspaces)
    result = MemoryPlan({}, {}, batch, crop, num_devices, keep_outputs, amp, recompute, limit)
    for strategy in strategies:
        try:
            result.splits[strategy], result.peaks[strategy] = strategy_peaks(simulator, strategy, batch, num_devices)
        except TypeError as err:
            if output_key is not None:
                raise
            raise ValueError(f"plan: the criterion failed on the model's output ({str(err).splitlines()[0]}); a "
                             "model that returns a dict or tuple (torchvision's {'out', 'aux'}) needs "
                             "output_key='out' (and aux_weight= for the auxiliary loss)") from None
        except (DynamicOutputShapeException, DataDependentOutputException) as err:
            raise ValueError(f"plan: {type(model).__name__} has output shapes that depend on the values ({err}: e.g. "
                             "a detector's box filtering and NMS), which fake tensors cannot simulate; measure it "
                             "with encoding.memory.measure_program_cpu") from None
    if limit is not None and sample is None:
        segmentation = hasattr(getattr(model, "backbone", None), "stages")  # the policies need its blocks
        result.advice = advise(spec_for, strategies, num_devices, batch, crop, limit, round_to,
                               RECOMPUTE_POLICIES if segmentation else ("none",), backend=backend,
                               workspaces=workspaces)  # the peaks' kernel buffers: the advice's too
    return result
