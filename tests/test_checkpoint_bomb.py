"""A checkpoint whose zip records would load into far more memory than the file's size is refused from the zip
central directory, before ``torch.load`` reads (and inflates) anything; genuine ``torch.save`` files still load."""
import copy
import io
import struct
import zipfile

import pytest
import torch
from torch import nn

from encoding.utils import checkpoint as checkpoint_module
from encoding.utils.checkpoint import CheckpointError, load_checkpoint, read_state_dict, save_checkpoint

DECLARED = 64 * 2 ** 20  # bytes the bomb's tensor record inflates to (its file is a few hundred KB at most)


def _saved(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return zipfile.ZipFile(buffer)


def _deflate_bomb(path):
    """A valid torch.save zip whose tensor record is deflated and whose pickle declares DECLARED / 4 floats."""
    genuine = _saved({"model": {"w": torch.zeros(7)}})
    pickled = genuine.read("archive/data.pkl").replace(b"K\x07", b"J" + struct.pack("<i", DECLARED // 4))
    with zipfile.ZipFile(path, "w") as archive:
        for name in genuine.namelist():
            if not name.endswith("data/0"):
                archive.writestr(name, pickled if name.endswith("data.pkl") else genuine.read(name))
                continue
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w") as record:
                for _ in range(DECLARED // 2 ** 20):
                    record.write(bytes(2 ** 20))


def _shared_body_bomb(path, copies=40):
    """Stored (uncompressed) records ``data/1..copies`` whose central-directory entries all point at ``data/0``'s
    body: each fits in the file, all together do not (torch.load reads each one, a tensor per entry)."""
    genuine = _saved({"model": {f"w{i}": torch.zeros(4096) for i in range(copies + 1)}})
    with zipfile.ZipFile(path, "w") as archive:
        for name in genuine.namelist():
            if not name.startswith("archive/data/") or name == "archive/data/0":
                archive.writestr(name, genuine.read(name))
        for i in range(1, copies + 1):
            twin = copy.copy(archive.getinfo("archive/data/0"))
            twin.filename = f"archive/data/{i}"
            archive.filelist.append(twin)  # written into the central directory, with data/0's offset


@pytest.fixture
def no_torch_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was reached")
    monkeypatch.setattr(checkpoint_module.torch, "load", refuse)


@pytest.mark.parametrize("build, reason", [(_deflate_bomb, "'archive/data/0' is compressed"),
                                           (_shared_body_bomb, "records declare")])
@pytest.mark.parametrize("read", [read_state_dict, load_checkpoint])
def test_a_zip_loading_into_more_than_its_size_is_refused_before_torch_load(tmp_path, no_torch_load, build,
                                                                             reason, read):
    path = tmp_path / "bomb.pth"
    build(path)
    assert path.stat().st_size < DECLARED // 100
    with pytest.raises(CheckpointError) as info:
        read(path)
    message = str(info.value)
    assert repr(str(path)) in message and reason in message and "\n" not in message, message


def test_torch_load_reads_records_sharing_one_body(tmp_path):
    """The shared-body bomb is no strawman: torch.load gives every entry its own tensor, read from the one body."""
    path = tmp_path / "bomb.pth"
    _shared_body_bomb(path, copies=3)
    state = torch.load(path, weights_only=True)["model"]
    assert len(state) == 4 and sum(t.numel() for t in state.values()) * 4 > path.stat().st_size


@pytest.mark.parametrize("kwargs", [{}, {"_use_new_zipfile_serialization": False}])
def test_genuine_torch_save_files_still_load(tmp_path, kwargs):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    path = tmp_path / "weights.pth"
    torch.save(model.state_dict(), path, **kwargs)
    state = read_state_dict(path)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with zipfile.ZipFile(save_checkpoint({"model": model, "epoch": 2}, tmp_path)) as archive:  # our own save path
        assert {r.compress_type for r in archive.infolist()} == {zipfile.ZIP_STORED}
    assert load_checkpoint(tmp_path / "checkpoint.pth")["epoch"] == 2
