"""mmcv's tests of its parallel package (tests/test_parallel.py of open-mmlab/mmcv 1.x), written as mmcv wrote them
where our names serve the same calls, on CPU.

mmcv's ``scatter`` (``mmcv.parallel.scatter_gather``) returns one structure per target device, as ours does; its
tests also call the per-tensor ``_functions.scatter``, whose results are those structures' entries: here the same
checks read ``outputs[0]``, the one device's inputs.
"""
import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from encoding.legacy import MODULE_WRAPPERS
from encoding.parallel import DataParallelModel, gather, is_module_wrapper, scatter
from encoding.parallel.scatter_gather import scatter_kwargs


def test_is_module_wrapper():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def forward(self, x):
            return self.conv(x)

    model = Model()
    assert not is_module_wrapper(model)

    dp = DataParallel(model, device_ids=[])
    assert is_module_wrapper(dp)

    mmdp = DataParallelModel(model, [-1])  # MMDataParallel(model) on a CPU machine
    assert is_module_wrapper(mmdp)

    ddp = DistributedDataParallel.__new__(DistributedDataParallel)  # mmcv mocks the process group
    assert is_module_wrapper(ddp)

    # test module wrapper registry
    @MODULE_WRAPPERS.register_module()
    class ModuleWrapper(object):

        def __init__(self, module):
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    try:
        module_wraper = ModuleWrapper(model)
        assert is_module_wrapper(module_wraper)
        assert MODULE_WRAPPERS.register_module(module=ModuleWrapper) is ModuleWrapper  # once in the list
        assert MODULE_WRAPPERS.count(ModuleWrapper) == 1
    finally:
        MODULE_WRAPPERS.remove(ModuleWrapper)
    assert not is_module_wrapper(ModuleWrapper(model))
    with pytest.raises(TypeError, match="expects a class"):
        MODULE_WRAPPERS.register_module()(len)


def test_scatter():
    # if the device is CPU, just return the input
    input = torch.zeros([1, 3, 3, 3])
    output = scatter(input, [-1])
    assert len(output) == 1 and torch.allclose(input, output[0])

    inputs = [torch.zeros([1, 3, 3, 3]), torch.zeros([1, 4, 4, 4])]
    outputs = scatter(inputs, [-1])
    assert len(outputs) == 1 and len(outputs[0]) == 2
    for input, output in zip(inputs, outputs[0]):
        assert torch.allclose(input, output)
    outputs = scatter(inputs, ["cpu"])  # the same with a device name
    assert type(outputs[0]) is list and all(o is i for o, i in zip(outputs[0], inputs))

    # if the device is GPU, copy the input from CPU to GPU
    if torch.cuda.is_available():
        input = torch.zeros([1, 3, 3, 3])
        output = scatter(input, [0])
        assert torch.allclose(input.cuda(), output[0])

        inputs = [torch.zeros([1, 3, 3, 3]), torch.zeros([1, 4, 4, 4])]
        outputs = scatter(inputs, [0])
        for input, output in zip(inputs, outputs[0]):
            assert torch.allclose(input.cuda(), output)


def test_scatter_refuses_only_where_the_reading_changes_the_split():
    """Two tensors of one sample each: per sample they are 2 samples, as batched tensors 1. One device gets the list
    as it is either way (its size is told as None: nothing was split); two devices would get different shares."""
    inputs = [torch.zeros([1, 3, 3, 3]), torch.zeros([1, 4, 4, 4])]
    parts, kwargs, sizes = scatter_kwargs((inputs,), {"flag": True}, [-1])
    assert sizes == [None] and kwargs == [{"flag": True}] and parts[0][0] == inputs
    with pytest.raises(ValueError, match=r"PerSample.*tuple"):
        scatter(inputs, [-1, -1])
    with pytest.raises(ValueError, match=r"PerSample.*tuple"):
        scatter(inputs, ["cpu", "cpu"])
    # a list whose reading is fixed by the batch next to it is split on several devices, and kept whole on one
    batch = torch.zeros(2, 5)
    parts = scatter((batch, [torch.zeros(1, 3), torch.zeros(1, 4)]), [-1, -1])
    assert [len(p[1]) for p in parts] == [1, 1]
    assert scatter((batch, [torch.zeros(1, 3), torch.zeros(1, 4)]), [-1])[0][1][1].shape == (1, 4)


def test_mmdataparallel_like_cpu_path_runs_the_module_on_the_inputs():
    """mmcv's MMDataParallel on a CPU machine: the module runs on the call's inputs as they are (a list of images
    of different sizes included), through forward, train_step and val_step."""
    class Model(nn.Module):
        def forward(self, imgs):
            return [img.mean() for img in imgs]

        def train_step(self, data, optimizer=None):
            return {"loss": sum(img.sum() for img in data["img"]), "num_samples": len(data["img"])}

        def val_step(self, data, optimizer=None):
            return self.train_step(data, optimizer)

    imgs = [torch.ones([1, 3, 3, 3]), torch.full([1, 4, 4, 4], 2.0)]
    mmdp = DataParallelModel(Model(), [-1])
    outputs = mmdp(imgs)
    assert len(outputs) == 1 and [float(v) for v in outputs[0]] == [1.0, 2.0]
    step = mmdp.train_step({"img": imgs}, None)
    assert float(step[0]["loss"]) == 27 + 128 and step[0]["num_samples"] == 2
    assert float(gather(mmdp.val_step({"img": imgs}, None), -1)["loss"]) == 155
