"""Synchronized-BatchNorm-PyTorch's tests (tests/test_sync_batchnorm.py of vacancy/Synchronized-BatchNorm-PyTorch),
written as vacancy wrote them, through ``encoding.nn``'s vacancy names on CPU replicas.

vacancy's "Sync" cases run ``DataParallelWithCallback(sync_bn, device_ids=[0, 1])`` on two GPUs; here the two
replicas are ``["cpu", "cpu"]`` (and the GPU pair where two GPUs are): every sample still goes through one of two
replicas whose statistics are synchronised, which is what the comparison with ``nn.BatchNorm`` checks.
"""
import unittest

import torch
import torch.nn as nn
from torch.autograd import Variable

from encoding.nn import SynchronizedBatchNorm1d, SynchronizedBatchNorm2d, set_sbn_eps_mode
from encoding.parallel import DataParallelWithCallback

set_sbn_eps_mode('plus')

DEVICES = [0, 1] if torch.cuda.device_count() >= 2 else ["cpu", "cpu"]
CUDA = DEVICES == [0, 1]


class TorchTestCase(unittest.TestCase):
    def assertTensorClose(self, x, y):
        adiff = float((x - y).abs().max())
        rdiff = 'NaN' if (y == 0).all() else float((adiff / y).abs().max())
        message = 'Tensor close check failed\nadiff={}\nrdiff={}\n'.format(adiff, rdiff)
        self.assertTrue(torch.allclose(x, y, atol=1e-5, rtol=1e-3), message)


def handy_var(a, unbias=True):
    n = a.size(0)
    asum = a.sum(dim=0)
    as_sum = (a ** 2).sum(dim=0)  # a square sum
    sumvar = as_sum - asum * asum / n
    if unbias:
        return sumvar / (n - 1)
    else:
        return sumvar / n


def _find_bn(module):
    for m in module.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, SynchronizedBatchNorm1d, SynchronizedBatchNorm2d)):
            return m


class SyncTestCase(TorchTestCase):
    def _syncParameters(self, bn1, bn2):
        bn1.reset_parameters()
        bn2.reset_parameters()
        if bn1.affine and bn2.affine:
            bn2.weight.data.copy_(bn1.weight.data)
            bn2.bias.data.copy_(bn1.bias.data)

    def _checkBatchNormResult(self, bn1, bn2, input, is_train, cuda=False):
        """Check the forward and backward for the customized batch normalization."""
        bn1.train(mode=is_train)
        bn2.train(mode=is_train)

        if cuda:
            input = input.cuda()

        self._syncParameters(_find_bn(bn1), _find_bn(bn2))

        input1 = Variable(input, requires_grad=True)
        output1 = bn1(input1)
        output1.sum().backward()
        input2 = Variable(input, requires_grad=True)
        output2 = bn2(input2)
        if isinstance(output2, (list, tuple)):  # DataParallelModel-style outputs: one per replica
            output2 = torch.cat(list(output2))
        output2.sum().backward()

        self.assertTensorClose(input1.data, input2.data)
        self.assertTensorClose(output1.data, output2.data)
        self.assertTensorClose(input1.grad, input2.grad)
        self.assertTensorClose(_find_bn(bn1).running_mean, _find_bn(bn2).running_mean)
        self.assertTensorClose(_find_bn(bn1).running_var, _find_bn(bn2).running_var)

    def testSyncBatchNormNormalTrain(self):
        bn = nn.BatchNorm1d(10)
        sync_bn = SynchronizedBatchNorm1d(10)

        self._checkBatchNormResult(bn, sync_bn, torch.rand(16, 10), True)

    def testSyncBatchNormNormalEval(self):
        bn = nn.BatchNorm1d(10)
        sync_bn = SynchronizedBatchNorm1d(10)

        self._checkBatchNormResult(bn, sync_bn, torch.rand(16, 10), False)

    def testSyncBatchNormSyncTrain(self):
        bn = nn.BatchNorm1d(10, eps=1e-5, affine=False)
        sync_bn = SynchronizedBatchNorm1d(10, eps=1e-5, affine=False)
        sync_bn = DataParallelWithCallback(sync_bn, device_ids=DEVICES)

        if CUDA:
            bn.cuda()
            sync_bn.cuda()

        self._checkBatchNormResult(bn, sync_bn, torch.rand(16, 10), True, cuda=CUDA)

    def testSyncBatchNormSyncEval(self):
        bn = nn.BatchNorm1d(10, eps=1e-5, affine=False)
        sync_bn = SynchronizedBatchNorm1d(10, eps=1e-5, affine=False)
        sync_bn = DataParallelWithCallback(sync_bn, device_ids=DEVICES)

        if CUDA:
            bn.cuda()
            sync_bn.cuda()

        self._checkBatchNormResult(bn, sync_bn, torch.rand(16, 10), False, cuda=CUDA)

    def testSyncBatchNorm2DSyncTrain(self):
        bn = nn.BatchNorm2d(10)
        sync_bn = SynchronizedBatchNorm2d(10)
        sync_bn = DataParallelWithCallback(sync_bn, device_ids=DEVICES)

        if CUDA:
            bn.cuda()
            sync_bn.cuda()

        self._checkBatchNormResult(bn, sync_bn, torch.rand(16, 10, 16, 16), True, cuda=CUDA)


class NumericTestCase(TorchTestCase):
    """vacancy's tests/test_numeric_batchnorm.py: the statistics the synchronised layers must reproduce."""

    def testNumericBatchNorm(self):
        a = torch.rand(16, 10)
        bn = nn.BatchNorm1d(10, momentum=1, eps=1e-5, affine=False)
        bn.train()

        a_var1 = Variable(a, requires_grad=True)
        b_var1 = bn(a_var1)
        loss1 = b_var1.sum()
        loss1.backward()

        a_var2 = Variable(a, requires_grad=True)
        a_mean2 = a_var2.mean(dim=0, keepdim=True)
        a_std2 = torch.sqrt(handy_var(a_var2, unbias=False).clamp(min=1e-5))
        b_var2 = (a_var2 - a_mean2) / a_std2
        loss2 = b_var2.sum()
        loss2.backward()

        self.assertTensorClose(bn.running_mean, a.mean(dim=0))
        self.assertTensorClose(bn.running_var, handy_var(a))
        self.assertTensorClose(a_var1.data, a_var2.data)
        self.assertTensorClose(b_var1.data, b_var2.data)
        self.assertTensorClose(a_var1.grad, a_var2.grad)

    def testNumericSyncBatchNorm(self):
        """The same numbers from the synchronised layer on two replicas (momentum 1: the running statistics are the
        batch's own, the variance unbiased)."""
        a = torch.rand(16, 10)
        sync_bn = DataParallelWithCallback(SynchronizedBatchNorm1d(10, momentum=1, eps=1e-5, affine=False), DEVICES)
        sync_bn.train()
        output = sync_bn(a.cuda() if CUDA else a)
        a_std = torch.sqrt(handy_var(a, unbias=False).clamp(min=1e-5))
        self.assertTensorClose(output.cpu(), (a - a.mean(dim=0, keepdim=True)) / a_std)
        self.assertTensorClose(sync_bn.module.running_mean.cpu(), a.mean(dim=0))
        self.assertTensorClose(sync_bn.module.running_var.cpu(), handy_var(a))
