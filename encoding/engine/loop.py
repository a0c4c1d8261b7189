"""Training and evaluation loops shared by ``experiments/segmentation`` (and usable in your own scripts).

The loops are device-agnostic: ``model`` may be a plain module, a :class:`~encoding.parallel.DataParallelModel`
(inputs stay on the CPU and are scattered to the replicas) or a DDP module (inputs are moved to ``device``).
The criterion is called as ``criterion(model(image), target)``; with ``DataParallelModel`` use a
:class:`~encoding.parallel.DataParallelCriterion` so the loss is computed on every device and reduced exactly.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn
from ..utils.progress import progress_bar as tqdm

from .builders import param_groups  # the optimizer's groups are built there; the engine exports them too
from ..parallel import DataParallelModel
from ..utils.dist import is_fully_sharded, is_main_process, reduce_across_processes
from ..utils.logger import MetricLogger, SmoothedValue
from .signals import GracefulInterrupt, Interrupted  # defined there; importable from here as before

__all__ = ["param_groups", "autocast_context", "backward_step", "check_finite_loss", "epoch_meters",
           "train_one_epoch", "evaluate", "evaluate_images", "predicted_labels", "Interrupted", "GracefulInterrupt"]

_EVAL_POSTFIX_EVERY = 10


def autocast_context(device: Optional[torch.device], dtype: Optional[torch.dtype],
                     model: Optional[nn.Module] = None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for mixed precision when ``dtype`` is given (else a no-op context), on ``device`` or, where
    it is ``None``, where ``model``'s parameters are (a DataParallelModel on GPUs takes its inputs on the CPU)."""
    if dtype is None:
        return contextlib.nullcontext()
    where = device or next((p.device for p in (model.parameters() if model is not None else ())), torch.device("cpu"))
    return torch.autocast(where.type, dtype=dtype)


def backward_step(loss: Tensor, optimizer: torch.optim.Optimizer, scaler: Optional[torch.amp.GradScaler] = None,
                  clip_grad_norm: Optional[float] = None) -> None:
    """``zero_grad`` → backward → (unscale →) optional gradient clipping → step (→ scaler update).

    Args:
        loss: the scalar loss.
        optimizer: the optimizer.
        scaler: a ``torch.amp.GradScaler`` for float16 training (``None`` otherwise).
        clip_grad_norm: clip the global gradient norm to this value, a positive finite number (``None``: no
            clipping).

    Raises:
        ValueError: ``clip_grad_norm`` is not a positive finite number (a negative one would flip the gradients,
            zero would erase them), or ``loss`` is not a scalar tensor; nothing is changed then.
    """
    if clip_grad_norm is not None and (isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, numbers.Real)
                                       or not math.isfinite(clip_grad_norm) or clip_grad_norm <= 0):
        raise ValueError(f"backward_step: clip_grad_norm must be a positive finite number (None: no clipping), "
                         f"got {clip_grad_norm!r}")
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise ValueError(f"backward_step: loss must be a scalar tensor, got "
                         f"{tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__}")
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if clip_grad_norm is not None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def check_finite_loss(value: float, epoch: int, iteration: int) -> None:
    """Refuse a step whose loss is NaN or infinite (the loop's default check before the backward).

    Raises:
        FloatingPointError: ``value`` is not finite (names the epoch and the iteration, counted from 0).
    """
    if not math.isfinite(value):
        raise FloatingPointError(f"loss is {value} at epoch {epoch}, iteration {iteration}; lower the learning "
                                 "rate or check the data")


def _inputs_on(batch: Sequence[Any], model: nn.Module, device: Optional[torch.device]) -> List[Any]:
    """Keep inputs on the CPU for a DataParallelModel (it scatters them); otherwise move them to ``device``."""
    if device is None or isinstance(model, DataParallelModel):
        return list(batch)
    return [b.to(device, non_blocking=True) if isinstance(b, Tensor) else b for b in batch]


def epoch_meters(totals: Optional[Mapping[str, Sequence[float]]] = None) -> MetricLogger:
    """The meters of a training epoch (``loss``; ``lr``, shown as its last value), holding ``totals``
    (:meth:`~encoding.utils.MetricLogger.totals` saved in the middle of the epoch) when given."""
    meters = MetricLogger()
    meters.add_meter("lr", SmoothedValue(window_size=1, fmt="{value:.2e}"))
    meters.add_totals(totals or {})
    return meters


def train_one_epoch(model: nn.Module, criterion: nn.Module, optimizer: torch.optim.Optimizer, loader: Iterable,
                    *, scheduler: Any = None, epoch: int = 0, device: Optional[torch.device] = None,
                    scaler: Optional[torch.amp.GradScaler] = None, amp_dtype: Optional[torch.dtype] = None,
                    clip_grad_norm: Optional[float] = None, start_iteration: int = 0,
                    stop: Optional[Callable[[], bool]] = None,
                    before_step: Optional[Callable[[int, float], None]] = None,
                    on_step: Optional[Callable[[int, Dict[str, float]], None]] = None,
                    meters: Optional[MetricLogger] = None) -> Dict[str, float]:
    """Train for one epoch with a tqdm bar showing the smoothed loss and the learning rate.

    Args:
        model: plain module, ``DataParallelModel`` or DDP module.
        criterion: called as ``criterion(model(image), target)``.
        optimizer: the optimizer.
        loader: yields ``(image, target, ...)`` batches.
        scheduler: a torch-style per-iteration scheduler of ``optimizer`` (e.g.
            :class:`~encoding.utils.lr_scheduler.IterationLR`): ``scheduler.step()`` after each ``optimizer.step()``
            (``None``: constant learning rate). It already holds the rates of the first iteration of this call.
        epoch: the epoch index (for messages and the progress bar).
        device: where plain/DDP models expect their inputs (``None``: leave the batch where it is).
        scaler: GradScaler for float16 autocast.
        amp_dtype: autocast dtype (``torch.bfloat16`` / ``torch.float16``) or ``None`` for full precision.
        clip_grad_norm: optional gradient-norm clipping.
        start_iteration: the index of the first batch ``loader`` yields (resuming mid-epoch: the loader already
            skips the batches done, see :class:`~encoding.utils.determinism.EpochSampler`).
        stop: polled after every iteration (e.g. :meth:`GracefulInterrupt.requested`); when it returns true,
            :class:`Interrupted` is raised with the number of iterations done.
        before_step: called after every forward, before the backward, as ``before_step(iteration, loss value)``
            (the iteration counted from 0); it refuses the step by raising (``None``: :func:`check_finite_loss`,
            a NaN/inf loss raises ``FloatingPointError``; the run's hooks check there instead).
        on_step: called after every step (the scheduler has stepped) as ``on_step(iterations done, {"loss": ...,
            "lr": ...})``, before ``stop`` is polled (the run calls its hooks' ``after_step`` there).
        meters: the epoch's running ``loss`` / ``lr`` meters (:func:`epoch_meters`; an epoch resumed mid-way passes
            them holding the totals of the iterations done before, so its averages cover the whole epoch).

    Everything after ``loader`` is a keyword argument.

    Returns:
        ``{"loss": mean training loss, "lr": mean learning rate of group 0}`` (averaged over processes under DDP).

    Raises:
        FloatingPointError: when the loss becomes NaN or infinite (names the epoch and iteration; the default
            ``before_step``).
        Interrupted: ``stop()`` returned true.
    """
    model.train()
    meters = meters if meters is not None else epoch_meters()
    check = before_step if before_step is not None else (lambda i, value: check_finite_loss(value, epoch, i))
    bar = tqdm(loader, desc=f"train {epoch}", disable=not is_main_process(), dynamic_ncols=True, leave=False)
    for i, batch in enumerate(bar, start=start_iteration):
        image, target = _inputs_on(batch[:2], model, device)
        with autocast_context(device, amp_dtype, model):
            loss = criterion(model(image), target)
        value = loss.item()  # one host sync per step, used for the check and the log
        try:
            check(i, value)
        except BaseException:
            bar.close()
            raise
        backward_step(loss, optimizer, scaler, clip_grad_norm)
        step = {"loss": value, "lr": optimizer.param_groups[0]["lr"]}  # the rate this step used
        meters.update(**step)
        if scheduler is not None:
            scheduler.step()
        bar.set_postfix(meters.postfix())
        try:
            if on_step is not None:
                on_step(i + 1, step)
            if stop is not None and stop():
                raise Interrupted(epoch, i + 1)
        except BaseException:
            bar.close()
            raise
    meters.synchronize_between_processes()
    return meters.global_averages()


@torch.inference_mode()
def evaluate(model: nn.Module, loader: Iterable, metric: Any, device: Optional[torch.device] = None,
             amp_dtype: Optional[torch.dtype] = None, *, stop: Optional[Callable[[], bool]] = None,
             epoch: int = 0, on_outputs: Optional[Callable[[Any, Sequence[Any]], None]] = None) -> Dict[str, Any]:
    """Evaluate ``model`` on ``loader`` with ``metric`` (a :class:`~encoding.utils.SegmentationMetric`).

    The model's (possibly ungathered, per-device) outputs go straight into ``metric.update`` — no logits are
    gathered onto one device. Under ``torch.distributed`` the confusion matrices of all processes are summed.

    Args:
        stop: polled after every batch; when it returns true, :class:`Interrupted` (``iteration=None``, for
            ``epoch``) is raised.
        on_outputs: called as ``on_outputs(outputs, batch)`` after each batch is scored (e.g. to save
            :func:`predicted_labels`).

    Returns:
        ``metric.compute()`` (pixAcc, mIoU, per-class IoU, ...).
    """
    model.eval()
    metric.reset()
    unscored = _unscored_forwards(model, loader)
    bar = _ScoreBar(metric, loader)
    for i, batch in enumerate(loader):
        bar.next_batch(i)
        image, target = _inputs_on(batch[:2], model, device)
        with autocast_context(device, amp_dtype, model):
            outputs = model(image)
        metric.update(outputs, target)
        if on_outputs is not None:
            on_outputs(outputs, batch)
        if stop is not None and stop():
            bar.bar.close()
            raise Interrupted(epoch, None)
    for _ in range(unscored):  # FSDP2 gathers the weights from every rank in each forward: as many on each rank
        with autocast_context(device, amp_dtype, model):
            model(_inputs_on([loader.dataset[0][0].unsqueeze(0)], model, device)[0])
    metric.reduce_from_all_processes()
    return bar.finish(metric.compute())


class _ScoreBar:
    """The evaluation loops' progress bar: the running pixAcc / mIoU now and then, and the final (all-process)
    scores on its last step. A batch is counted when the next one starts, the last one by :meth:`finish`, so the bar
    reaches 100 % showing the scores the caller prints (piped: the last line of the log shows them)."""

    def __init__(self, metric: Optional[Any], loader: Iterable) -> None:
        self.metric, self.done = metric, 0
        total = len(loader) if hasattr(loader, "__len__") else None
        self.bar = tqdm(total=total, desc="eval", disable=not is_main_process(), dynamic_ncols=True, leave=False)

    def next_batch(self, index: int) -> None:
        """Batch ``index`` starts: count the one before; refresh the scores every ``_EVAL_POSTFIX_EVERY`` batches
        (a host sync)."""
        if index:
            if self.metric is not None and index % _EVAL_POSTFIX_EVERY == 0:
                self._show(*self.metric.get())
            self.bar.update(1)
        self.done = index + 1

    def _show(self, pix_acc: float, miou: float) -> None:
        self.bar.set_postfix(pixAcc=f"{pix_acc:.4f}", mIoU=f"{miou:.4f}", refresh=False)

    def finish(self, result: Any) -> Any:
        """Count the last batch with the final scores of ``result`` (``None``: no scores) and close; returns
        ``result``."""
        if result is not None:
            self._show(result["pixAcc"], result["mIoU"])
        if self.done:
            self.bar.update(1)
            self.bar.refresh()
        self.bar.close()
        return result


def _unscored_forwards(model: nn.Module, loader: Iterable) -> int:
    """How many forwards past its evaluation shard this rank runs (a collective, before the first forward): under
    FSDP2 every rank runs as many as the rank with the most batches; otherwise none."""
    return int(reduce_across_processes(len(loader), "max")) - len(loader) if is_fully_sharded(model) else 0


def predicted_labels(outputs: Any, threshold: float = 0.5) -> List[Tensor]:
    """Per-sample predicted class maps (``H x W`` ``int64``, on the CPU) from a model's outputs.

    Args:
        outputs: logits ``B x C x H x W``, a model output dict (its ``"out"``), or the ungathered per-replica list of
            :class:`~encoding.parallel.DataParallelModel` (only the small label maps leave each device).
        threshold: the foreground threshold of a one-channel (binary) output.
    """
    from ..utils.metrics import labels_of, main_output  # the metric's idea of "the main output", in one place

    replicas = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [labels for out in replicas for labels in labels_of(main_output(out), threshold).cpu().unbind(0)]


@torch.inference_mode()
def evaluate_images(evaluator: nn.Module, loader: Iterable, metric: Optional[Any] = None,
                    devices: Sequence[torch.device] = (torch.device("cpu"),), amp_dtype: Optional[torch.dtype] = None,
                    *, on_outputs: Optional[Callable[[List[Tensor], Sequence[Any]], None]] = None,
                    ) -> Optional[Dict[str, Any]]:
    """Evaluate whole images of any size, one image per device at a time (e.g. multi-scale inference).

    Each batch of ``loader`` holds per-sample lists, ``(images, masks[, names])`` or ``(images, names)`` (no masks:
    nothing is scored), as collated by :func:`encoding.datasets.list_collate`; images have no batch dimension and
    may differ in size. With several ``devices`` the evaluator is replicated (:func:`encoding.parallel.replicate`)
    and the images of a batch run in parallel, each on its own device, and are scored there: the logits never meet
    on one device. Under ``torch.distributed`` the confusion matrices of all processes are summed.

    Args:
        evaluator: maps ``1 x 3 x H x W`` to logits ``1 x C x H x W`` (e.g. :class:`~encoding.models.MultiEvalModule`)
            or to a model's output dict (its ``"out"`` is scored), on ``devices[0]``.
        loader: batches of at most ``len(devices)`` samples.
        metric: a :class:`~encoding.utils.SegmentationMetric`, or ``None`` to only predict.
        devices: where the replicas run.
        amp_dtype: autocast dtype (``None``: full precision).
        on_outputs: called as ``on_outputs(logits, batch)`` with one ``1 x C x H x W`` tensor per image.

    Returns:
        ``metric.compute()``, or ``None`` without a metric.
    """
    from ..parallel import parallel_apply, replicate
    from ..utils.metrics import main_output

    evaluator.eval()
    if metric is not None:
        metric.reset()
    devices = list(devices)
    replicas = replicate(evaluator, devices) if len(devices) > 1 else [evaluator]
    bar = _ScoreBar(metric, loader)
    for i, batch in enumerate(loader):
        bar.next_batch(i)
        images = batch[0]
        if len(images) > len(devices):
            bar.bar.close()
            raise ValueError(f"a batch of {len(images)} images for {len(devices)} device(s): use batch_size "
                             f"<= {len(devices)}")
        inputs = [(image.unsqueeze(0).to(device),) for image, device in zip(images, devices)]
        with autocast_context(devices[0], amp_dtype):
            if len(inputs) == 1:
                logits = [replicas[0](*inputs[0])]
            else:
                logits = parallel_apply(replicas[:len(inputs)], inputs, devices=devices[:len(inputs)])
        logits = [main_output(out) for out in logits]  # a model's {"out": ...} dict, or logits
        has_masks = len(batch) > 1 and isinstance(batch[1][0], Tensor)
        if metric is not None and has_masks:
            metric.update(logits, [mask.unsqueeze(0).to(out.device) for mask, out in zip(batch[1], logits)])
        if on_outputs is not None:
            on_outputs(logits, batch)
    if metric is None:
        return bar.finish(None)
    metric.reduce_from_all_processes()
    return bar.finish(metric.compute())
