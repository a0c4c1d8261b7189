"""Reproducible training that survives an interruption: RNG states, per-epoch sample order, seeded samples.

A resumed run ends bitwise equal to an uninterrupted one (on the CPU; on CUDA with ``--deterministic``) because
every source of randomness is either a pure function of ``(seed, epoch, sample)`` or saved in the checkpoint:

* :class:`EpochSampler` orders the samples of an epoch from ``(seed, epoch)`` only (a ``DistributedSampler``, one
  replica when not distributed), can start in the middle of an epoch, and yields ``(epoch, index)`` keys;
* :class:`SeededSamples` draws each sample's augmentation from its own generator seeded by ``(seed, epoch, index)``
  (the global RNG is restored afterwards), so the data does not depend on workers, their number or where a run
  stopped;
* :func:`rng_state` / :func:`set_rng_state` capture and restore the global torch (CPU and CUDA), numpy and Python
  generators, which the model itself uses (dropout) and which a checkpoint stores;
* :func:`enable_determinism`: ``torch.use_deterministic_algorithms`` and cuDNN/cuBLAS settings
  (``train.py --deterministic``); :func:`seed_worker` seeds numpy and ``random`` in DataLoader workers.
"""
from __future__ import annotations

import os
import random
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler

__all__ = ["rng_state", "set_rng_state", "enable_determinism", "seed_worker", "sample_seed", "EpochSampler",
           "SeededSamples"]


def rng_state() -> Dict[str, Any]:
    """The global generators' states as tensors and plain values (storable in a ``weights_only`` checkpoint)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": version, "internal": list(internal), "gauss": gauss}}


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA states only when as many devices are visible)."""
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))


def enable_determinism() -> None:
    """Make torch choose deterministic kernels (raising where none exists) and fix cuDNN/cuBLAS behaviour."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=...)``: seed numpy and ``random`` from the worker's torch seed."""
    seed = torch.initial_seed() % 2 ** 32
    np.random.seed(seed)
    random.seed(seed)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that depends only on ``(seed, epoch, index)``."""
    state = np.random.SeedSequence([int(seed) % 2 ** 63, int(epoch), int(index)]).generate_state(2, np.uint64)
    return int(state[0] >> np.uint64(1))


class EpochSampler(DistributedSampler):
    """A ``DistributedSampler`` (one replica by default) that yields ``(epoch, index)`` and can start mid-epoch.

    The order of an epoch depends only on ``(seed, epoch)``, so a resumed run sees the same samples in the same
    order; :meth:`set_epoch` with ``start=k`` skips the first ``k`` samples of that epoch (without loading them).

    Args:
        dataset: anything with a length.
        shuffle, seed, drop_last: as for ``DistributedSampler``.
        num_replicas, rank: ``None`` with ``distributed=False`` means a single replica (no process group needed).
        distributed: take ``num_replicas``/``rank`` from ``torch.distributed`` when they are not given.
    """

    def __init__(self, dataset: Sequence, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None, distributed: bool = False) -> None:
        if not distributed:
            num_replicas, rank = num_replicas or 1, rank or 0
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of ``epoch``, beginning at its ``start``-th sample (of this replica)."""
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[Tuple[int, int]]:  # type: ignore[override]
        indices = list(super().__iter__())[self.start:]
        return iter([(self.epoch, index) for index in indices])

    def __len__(self) -> int:
        return max(super().__len__() - self.start, 0)


class SeededSamples(Dataset):
    """Wraps a dataset so that sample ``(epoch, index)`` is drawn with torch seeded by ``(seed, epoch, index)``.

    The global torch RNG is left as it was, so the model's own randomness (dropout) is unaffected by loading.
    Plain integer keys load the sample unseeded.

    Attributes:
        dataset: the wrapped dataset (``len``, attributes and ``num_skipped`` are forwarded).
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, int(seed)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):  # unpickling; and no batched __getitems__ of the wrapped
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            return self.dataset[key]
        epoch, index = key
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only (what fork_rng restores): torch.manual_seed would also seed every accelerator's
            # generator, unrestored, and capture a stack trace per sample for the lazy seeding of an unused one
            torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
            return self.dataset[index]
