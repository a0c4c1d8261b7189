"""--compile: torch.compile (inductor, C++ kernels on the CPU) equals eager to float tolerance, with DataParallelModel
replicas, DDP, activation recomputation and checkpoints; where it cannot compile it says so and runs eager."""
import copy

import pytest
import torch
from torch import nn

from encoding.engine.compiled import CompileWarning, compile_mode, compile_model, eager_module, is_compiled
from encoding.nn.recompute import enable_checkpointing
from encoding.parallel import DataParallelCriterion, DataParallelModel

TOL = dict(rtol=1e-4, atol=1e-5)
# a network that silently ran eager would pass the comparisons: any CompileWarning not expected fails the test
pytestmark = pytest.mark.filterwarnings("error::encoding.engine.compiled.CompileWarning")


class Tiny(nn.Module):
    """Conv-BN-ReLU, a residual block and a 1x1 head: {"out": logits} (a segmentation model's interface)."""

    def __init__(self, classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        y = self.stem(x)
        return {"out": self.head(torch.relu(y + self.block(y)))}


def _pair(**options):
    torch.manual_seed(0)
    eager = Tiny()
    return eager, compile_model(copy.deepcopy(eager), dynamic=False, **options)


def _batch(seed=1, n=4):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=generator), torch.randint(0, 4, (n, 16, 16), generator=generator)


def _steps(model, criterion, steps=3, wrap=lambda m: m):
    """Loss and gradients of ``steps`` SGD steps of ``wrap(model)``."""
    wrapped = wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    record = []
    for step in range(steps):
        x, y = _batch(step)
        optimizer.zero_grad()
        loss = criterion(wrapped(x), y)
        loss.backward()
        record.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        optimizer.step()
    return record


def assert_same_steps(got, want):
    for (loss, grads), (loss_ref, grads_ref) in zip(got, want):
        torch.testing.assert_close(loss, loss_ref, **TOL)
        for g, r in zip(grads, grads_ref):
            torch.testing.assert_close(g, r, **TOL)


def cross_entropy(out, target):
    return nn.functional.cross_entropy(out["out"], target)


def test_compiled_training_equals_eager_and_saves_plain_keys(tmp_path):
    eager, compiled = _pair()
    assert is_compiled(compiled) and not is_compiled(eager)
    assert_same_steps(_steps(compiled, cross_entropy), _steps(eager, cross_entropy))
    for (name, a), (other, b) in zip(compiled.state_dict().items(), eager.state_dict().items()):
        assert name == other and "_orig_mod" not in name
        torch.testing.assert_close(a, b, **TOL)
    torch.save(compiled.state_dict(), tmp_path / "weights.pth")  # a resume: into a plain and a compiled network
    plain, again = Tiny().eval(), compile_model(Tiny(), dynamic=False).eval()
    for model in (plain, again):
        model.load_state_dict(torch.load(tmp_path / "weights.pth", weights_only=True))
    x = _batch(5)[0]
    with torch.no_grad():
        torch.testing.assert_close(again(x)["out"], plain(x)["out"], **TOL)
    assert not is_compiled(copy.deepcopy(compiled))  # a copy is the eager network, with the same weights
    assert not is_compiled(eager_module(compiled)) and type(compiled) is Tiny


def test_replicas_run_compiled_and_exact():
    """Replicas are new modules each step, holding per-device copies of the parameters: they share the compiled
    graph (no recompilation per step or per replica) and their gradients reach the network's parameters."""
    from torch._dynamo.utils import counters

    from encoding.parallel.replicate import replicate

    def replicated(model):
        def forward(x):
            outs = [replica(half) for replica, half in zip(replicate(model, ["cpu", "cpu"]), x.chunk(2))]
            return {"out": torch.cat([o["out"] for o in outs])}
        return forward

    eager, compiled = _pair()
    counters.clear()
    got = _steps(compiled, cross_entropy, wrap=replicated)
    assert counters["stats"]["unique_graphs"] == 1  # 2 replicas x 3 steps, one graph
    assert_same_steps(got, _steps(eager, cross_entropy, wrap=replicated))


def test_data_parallel_model_with_a_compiled_network_equals_eager():
    """On a repeated device (the tests' "cpu", "cpu") each replica draws from its own random stream, a dispatch mode
    that torch.compile does not trace: the replicas then run eager, and one line says so."""
    eager, compiled = _pair()
    criterion = DataParallelCriterion(nn.CrossEntropyLoss(), ["cpu", "cpu"], output_key="out")
    with pytest.warns(CompileWarning, match="runs eager under a dispatch mode") as caught:
        got = _steps(compiled, criterion, wrap=lambda m: DataParallelModel(m, ["cpu", "cpu"]))
    assert len([w for w in caught if w.category is CompileWarning]) == 1
    assert_same_steps(got, _steps(eager, criterion, wrap=lambda m: DataParallelModel(m, ["cpu", "cpu"])))


def test_compiled_recomputation_equals_eager():
    eager, compiled = _pair()
    for model in (eager, compiled):
        enable_checkpointing(model.block)
    assert_same_steps(_steps(compiled, cross_entropy), _steps(eager, cross_entropy))
    for a, b in zip(compiled.buffers(), eager.buffers()):  # BatchNorm's running statistics: updated once per step
        torch.testing.assert_close(a, b, **TOL)


def test_compiled_under_ddp_equals_eager(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        eager, compiled = _pair()
        ddp = nn.parallel.DistributedDataParallel
        assert_same_steps(_steps(compiled, cross_entropy, wrap=ddp), _steps(eager, cross_entropy, wrap=ddp))
    finally:
        dist.destroy_process_group()


class Unsupported(Tiny):
    def forward(self, x):  # a graph break, which fullgraph=True refuses
        torch._dynamo.graph_break()
        return super().forward(x)


def test_what_cannot_compile_says_so_in_one_line_and_runs_eager(monkeypatch):
    torch.manual_seed(0)
    model = compile_model(Unsupported(), dynamic=False, fullgraph=True)
    x = _batch()[0]
    with pytest.warns(CompileWarning, match="could not be compiled .*; running eager") as caught:
        out = model(x)["out"]
    assert "\n" not in str(caught[0].message)
    torch.testing.assert_close(out, eager_module(copy.deepcopy(model))(x)["out"])
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)  # no C++ compiler for inductor's CPU kernels
    with pytest.warns(CompileWarning, match=r"C\+\+ compiler and none was found .*; running eager"):
        assert not is_compiled(compile_model(Tiny()))


#: :class:`Tiny`'s forward, compiled and eager, in a process of its own: the largest difference of the outputs (a
#: CompileWarning, eager in disguise, fails it). Inference only: the backward's graphs go through the same cache.
_CAPPED_STEP = """
import copy, sys, warnings
import torch
sys.path.insert(0, sys.argv[1])
from test_compile import Tiny, _batch
from encoding.engine.compiled import CompileWarning, compile_model
warnings.simplefilter("error", CompileWarning)
torch.manual_seed(0)
eager = Tiny()
compiled = compile_model(copy.deepcopy(eager), dynamic=False)
x = _batch()[0]
with torch.no_grad():
    print((eager(x)["out"] - compiled(x)["out"]).abs().max().item())
"""


def test_capped_cpu_kernels_do_not_read_graphs_compiled_for_another_instruction_set(tmp_path):
    """torch's inductor graph cache is not keyed by ``ATEN_CPU_CAPABILITY``: a network compiled once with the
    machine's kernels, then with the capability capped below them, read the first graph (torch 2.14: outputs of 1e23
    under avx2 after AVX-512, a compile error under default after AVX2). Capped, the graph cache is not used. The
    processes share the suite's inductor cache (as the other compile tests: its C++ headers are built once)."""
    import os
    import subprocess
    import sys

    native = torch.backends.cpu.get_cpu_capability()
    if native == "DEFAULT":
        pytest.skip("the CPU's kernels are torch's baseline already: no capability below them to cap to")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    for capability in (None, "avx2" if native.startswith("AVX512") else "default"):
        run_env = env if capability is None else {**env, "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", _CAPPED_STEP, os.path.dirname(__file__)], env=run_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (capability, done.stderr[-3000:])
        assert float(done.stdout.split()[-1]) <= 1e-4, (capability, done.stdout)


def test_compile_modes():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert compile_mode("none", [cpu]) is None and compile_mode("auto", [cpu]) == "default"
    assert compile_mode("auto", [gpu]) == "reduce-overhead" and compile_mode("auto", [gpu, gpu]) == "default"
    with pytest.raises(ValueError, match="unknown compile choice 'fast'"):
        compile_mode("fast", [cpu])


def test_train_and_test_scripts_compile_save_plain_checkpoints_and_resume(shapes_root, tmp_path, monkeypatch):
    """train.py --compile: the network compiled (here with AOTAutograd's eager backend, the inductor-free part of the
    pipeline, to keep the test short), its checkpoint loadable by a plain network, resumed compiled; test.py
    --compile --mode slide scores as eager."""
    import encoding
    from conftest import TINY, load_script, tiny_eval_set, tiny_shapes_pair

    compiled = []
    original = torch.compile

    def spy(function, **options):
        compiled.append(options)
        return original(function, **dict(options, backend="aot_eager"))

    monkeypatch.setattr(torch, "compile", spy)
    train = load_script("train").main
    common = TINY + ["--output-dir", str(tmp_path)]
    train(common + ["--compile"], datasets=tiny_shapes_pair(shapes_root))
    assert len(compiled) == 1
    checkpoint = tmp_path / "shapes" / "unet" / "default" / "checkpoint.pth"
    saved = torch.load(checkpoint, weights_only=True)["model"]
    assert not [key for key in saved if "_orig_mod" in key]
    plain = encoding.load_model(str(checkpoint))
    assert not is_compiled(plain)
    train(common + ["--compile", "--resume", str(checkpoint), "--epochs", "2"], datasets=tiny_shapes_pair(shapes_root))
    assert len(compiled) == 2 and torch.load(checkpoint, weights_only=True)["epoch"] == 1  # 0-based
    scores = [load_script("test").main(["--workers", "0", "--resume", str(checkpoint), "--mode", "slide",
                                        "--window", "24", "--window-batch", "3", "--out-dir", str(tmp_path), *more],
                                       data=tiny_eval_set(shapes_root, "testval"))
              for more in ([], ["--compile"])]
    assert len(compiled) == 3
    assert scores[1]["mIoU"] == pytest.approx(scores[0]["mIoU"], abs=1e-6)


@pytest.mark.gpu
def test_cuda_graphs_on_one_gpu_train_and_evaluate_like_eager():
    """``--compile auto`` on one GPU is ``reduce-overhead`` (CUDA graphs): three SGD steps in float64 equal eager's,
    an evaluation between training steps (another graph) too, and training after it."""
    gpu = torch.device("cuda", 0)
    mode = compile_mode("auto", [gpu])
    assert mode == "reduce-overhead"
    torch.manual_seed(0)
    eager = Tiny().double().to(gpu)
    compiled = compile_model(copy.deepcopy(eager), mode, dynamic=False)

    def on_gpu(model):
        return lambda x: model(x.double().to(gpu))

    def criterion(out, target):
        return cross_entropy(out, target.to(gpu))

    assert_same_steps(_steps(compiled, criterion, wrap=on_gpu), _steps(eager, criterion, wrap=on_gpu))
    x = _batch(7)[0].double().to(gpu)
    with torch.no_grad():
        outputs = [model.eval()(x)["out"].clone() for model in (compiled, eager)]
    torch.testing.assert_close(*outputs, **TOL)
    for model in (compiled, eager):
        model.train()
    assert_same_steps(_steps(compiled, criterion, wrap=on_gpu), _steps(eager, criterion, wrap=on_gpu))


@pytest.mark.gpu
def test_train_script_compiles_with_cuda_graphs_on_one_gpu(shapes_root, tmp_path):
    """train.py --compile on a GPU (one device: CUDA graphs) trains, validates and saves like eager: the epoch's
    mean loss within a percent (TF32 convolutions may pick other kernels), no CompileWarning (an error here)."""
    import json

    from conftest import TINY, load_script, tiny_shapes_pair

    train = load_script("train").main
    losses = []
    for name, more in (("compiled", ["--compile"]), ("eager", [])):
        train(TINY + ["--output-dir", str(tmp_path / name)] + more, datasets=tiny_shapes_pair(shapes_root))
        log = tmp_path / name / "shapes" / "unet" / "default" / "log.jsonl"
        losses.append(json.loads(log.read_text().splitlines()[-1])["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-2)
