"""torch's tests of ``nn.DataParallel`` (test/distributed/test_data_parallel.py of pytorch/pytorch) where they apply
to ours, written as torch wrote them, on CPU replicas: ``encoding.parallel.data_parallel`` for
``torch.nn.parallel.data_parallel``, ``DataParallelWithCallback`` for ``nn.DataParallel`` (both gather), and
``encoding.parallel.parallel_apply``.

torch runs them on ``(0, 1)`` GPU pairs; here ``CPU2 = ["cpu", "cpu"]`` stands for the pair and ``["cpu"]`` for one
device.
"""
from collections import OrderedDict

import pytest
import torch
from torch import nn

from encoding.parallel import DataParallelWithCallback, data_parallel, parallel_apply

CPU2 = ["cpu", "cpu"]


def test_data_parallel_multiple_input():
    class TestModule(nn.Module):

        def forward(self, var1, var2, float1, var3=None):
            if var3 is None:
                return float1 * (var1 * var2)
            else:
                return float1 * (var1 * var2 + var3)

    m = TestModule()
    var1 = torch.randn(5, 5, dtype=torch.float, requires_grad=True)
    var2 = torch.randn(5, 5, dtype=torch.float, requires_grad=True)
    var3 = torch.randn(5, 5, dtype=torch.float, requires_grad=False)

    float1 = torch.randn(1).item()

    expected = m(var1, var2, float1)
    loss = expected.sum()
    loss.backward()
    gvar1_exp = var1.grad.clone()
    gvar2_exp = var2.grad.clone()

    def local_test(out):
        with torch.no_grad():
            var1.grad.fill_(0.0)
            var2.grad.fill_(0.0)
        loss = out.sum()
        loss.backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(gvar1_exp, var1.grad)
        torch.testing.assert_close(gvar2_exp, var2.grad)

    out = data_parallel(m, (var1, var2, float1), CPU2)
    local_test(out)

    out = data_parallel(m, (var1, var2, float1), ["cpu"])
    local_test(out)

    with torch.no_grad():
        var1.grad.fill_(0.0)
        var2.grad.fill_(0.0)
    expected = m(var1, var2, float1, var3=var3)
    loss = expected.sum()
    loss.backward()
    gvar1_exp = var1.grad.clone()
    gvar2_exp = var2.grad.clone()

    dpm = DataParallelWithCallback(TestModule(), CPU2)
    out = dpm(var1, var2, float1, var3=var3)
    local_test(out)

    dpm = DataParallelWithCallback(TestModule(), device_ids=["cpu"])
    out = dpm(var1, var2, float1, var3=var3)
    local_test(out)

    kwarg_wrap = {'var3': var3}
    out = data_parallel(m, (var1, var2, float1), CPU2, module_kwargs=kwarg_wrap)
    local_test(out)

    out = data_parallel(m, (var1, var2, float1), ["cpu"], module_kwargs=kwarg_wrap)
    local_test(out)


def test_data_parallel_small_back():
    l = nn.Linear(10, 5).float()  # noqa: E741 - torch's name
    i = torch.randn(20, 10, dtype=torch.float)
    out = data_parallel(l, i, CPU2)
    torch.testing.assert_close(out, l(i))


def test_data_parallel_no_grad():
    seen = []

    class Layer(nn.Module):
        def forward(self, x):
            seen.append(torch.is_grad_enabled())
            return x

    l = Layer()  # noqa: E741 - torch's name
    i = torch.randn(20, 10, dtype=torch.float)
    with torch.no_grad():
        data_parallel(l, i, CPU2)
    assert seen == [False, False]
    data_parallel(l, i, CPU2)
    assert seen[2:] == [True, True]


def test_data_parallel_nested_output():
    def fn(input):
        return [
            input, (input.sin(), input.cos(), [input.add(1)]), input,
            OrderedDict(a=input, b=[input.sin()])
        ]

    class Net(nn.Module):
        def forward(self, input):
            return fn(input)

    i = torch.randn(2, 2).float()
    output = data_parallel(Net(), i, CPU2)
    torch.testing.assert_close(output, fn(i))
    assert isinstance(output[0], torch.Tensor)
    assert isinstance(output[1], tuple)
    assert isinstance(output[1][0], torch.Tensor)
    assert isinstance(output[1][1], torch.Tensor)
    assert isinstance(output[1][2], list)
    assert isinstance(output[1][2][0], torch.Tensor)
    assert isinstance(output[2], torch.Tensor)
    assert isinstance(output[3], dict)
    assert len(output[3]) == 2
    assert 'a' in output[3]
    assert 'b' in output[3]
    assert isinstance(output[3]['a'], torch.Tensor)
    assert isinstance(output[3]['b'], list)
    assert isinstance(output[3]['b'][0], torch.Tensor)


def test_data_parallel_nested_input():
    def fn(input):
        return input[1][0]

    class Net(nn.Module):
        def forward(self, *input):
            return fn(input)

    i = torch.randn(20, 3, dtype=torch.float)
    input = (i.cos(), (i.sin(), i), i.sin())
    output = data_parallel(Net(), input, CPU2)
    torch.testing.assert_close(output, fn(input))


def test_parallel_apply():
    l1 = nn.Linear(10, 5).to("cpu", torch.float)
    l2 = nn.Linear(10, 5).to("cpu", torch.float)
    i1 = torch.randn(2, 10, device="cpu", dtype=torch.float)
    i2 = torch.randn(2, 10, device="cpu", dtype=torch.float)
    expected1 = l1(i1)
    expected2 = l2(i2)
    modules = (l1, l2)
    expected_outputs = (expected1, expected2)

    # each input can be either a collection of positional arguments
    #                       or an object representing the single argument
    for inputs in [((i1,), (i2,)), (i1, i2)]:
        outputs = parallel_apply(modules, inputs, None, CPU2)
        for out, expected in zip(outputs, expected_outputs):
            torch.testing.assert_close(out, expected)


def test_parallel_apply_passes_exception():
    # we define and instantiate a module that will throw a KeyError
    class TestModule(nn.Module):

        def forward(self, *args):
            return {}['wonderful']

    l1 = TestModule().to("cpu", torch.float)
    # and check that parallel_apply passes on the exception
    # (we can use a single device twice for this test)
    with pytest.raises(KeyError, match=r"Caught KeyError in replica \d on device cpu.\nOriginal traceback"
                                       r"[\s\S]+wonderful"):
        parallel_apply(modules=(l1, l1), inputs=(None, None), devices=CPU2)
