"""encoding.datasets.prepare.download (local, file:// and HTTP with Range, resume, extraction) and encoding.utils.files
(checksums, staging)."""
import hashlib
import io
import os
import tarfile
import zipfile

import pytest
from payload_server import serve_payload

from encoding.datasets.prepare.download import DownloadError, download, extract
from encoding.utils.files import ChecksumError, check_checksum, file_checksum, staged_dir, verify_checksum

PAYLOAD = bytes(range(256)) * 64 + b"tail"  # 16388 bytes


def _write(path, data=PAYLOAD):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _md5(data=PAYLOAD):
    return hashlib.md5(data).hexdigest()


def test_download_local_path_and_file_url_verify_checksums(tmp_path):
    src = _write(tmp_path / "src" / "data.bin")
    for i, (url, checksum) in enumerate([
            (src, "md5:" + _md5()),
            ("file://" + src, hashlib.sha256(PAYLOAD).hexdigest()),  # bare hex: algorithm from the length
            (src, "sha1:" + hashlib.sha1(PAYLOAD).hexdigest())]):
        out = download(url, str(tmp_path / f"out{i}"), checksum=checksum, progress=False)
        with open(out, "rb") as f:
            assert f.read() == PAYLOAD
        assert not os.path.exists(out + ".part")
    # a folder destination keeps the source's file name
    os.makedirs(str(tmp_path / "dir"))
    assert download(src, str(tmp_path / "dir"), progress=False) == str(tmp_path / "dir" / "data.bin")
    # PyTorch-Encoding's spelling: download(url, path, overwrite, sha1_hash)
    sha1 = hashlib.sha1(PAYLOAD).hexdigest()
    out = download(src, str(tmp_path / "pe.bin"), False, sha1, progress=False)
    with pytest.raises(ChecksumError):
        download(src, str(tmp_path / "pe2.bin"), sha1_hash="0" * 40, progress=False)


def test_pytorch_encoding_mkdir_and_check_sha1_still_resolve_from_utils_files(tmp_path):
    from encoding.utils.files import check_sha1, mkdir  # PyTorch-Encoding's names, from the one table of old names

    mkdir(str(tmp_path / "dir"))
    assert os.path.isdir(tmp_path / "dir")
    src = _write(tmp_path / "src" / "data.bin")
    sha1 = hashlib.sha1(PAYLOAD).hexdigest()
    out = download(src, str(tmp_path / "pe.bin"), False, sha1, progress=False)
    assert check_sha1(out, sha1) and not check_sha1(out, "0" * 40)


def test_checksum_mismatch_leaves_nothing_behind(tmp_path):
    src = _write(tmp_path / "data.bin")
    dest = tmp_path / "dl" / "data.bin"
    with pytest.raises(ChecksumError, match="checksum mismatch.*data.bin") as info:
        download(src, str(dest), checksum="md5:" + "0" * 32, progress=False)
    assert info.value.actual == "md5:" + _md5()
    assert os.listdir(tmp_path / "dl") == []


def test_malformed_checksum_and_missing_source(tmp_path):
    src = _write(tmp_path / "data.bin")
    with pytest.raises(ValueError, match="hash algorithm"):
        download(src, str(tmp_path / "x"), checksum="abc", progress=False)
    with pytest.raises(DownloadError, match="no such file"):
        download(str(tmp_path / "missing.bin"), str(tmp_path / "y"), progress=False)


def test_resume_appends_to_partial_file(tmp_path):
    src = _write(tmp_path / "data.bin")
    dest = str(tmp_path / "dl" / "data.bin")
    # A partial download whose bytes differ from the source proves the rest is appended, not re-fetched.
    _write(dest + ".part", b"X" * 1000)
    download(src, dest, progress=False)
    with open(dest, "rb") as f:
        assert f.read() == b"X" * 1000 + PAYLOAD[1000:]
    # With a checksum, the bad resumed file is rejected and removed.
    _write(dest + ".part", b"X" * 1000)
    os.remove(dest)
    with pytest.raises(ChecksumError):
        download(src, dest, checksum="md5:" + _md5(), progress=False)
    assert not os.path.exists(dest) and not os.path.exists(dest + ".part")


def test_idempotent_rerun_and_refetch_of_bad_copy(tmp_path):
    src = _write(tmp_path / "data.bin")
    dest = str(tmp_path / "dl" / "data.bin")
    download(src, dest, checksum="md5:" + _md5(), progress=False)
    os.remove(src)  # a verified copy is reused: the source is not read again
    assert download(src, dest, checksum="md5:" + _md5(), progress=False) == dest
    _write(src)
    _write(dest, b"corrupted")  # a copy with the wrong checksum is fetched again
    download(src, dest, checksum="md5:" + _md5(), progress=False)
    assert check_checksum(dest, "md5:" + _md5())
    assert file_checksum(dest, "md5") == _md5()
    with pytest.raises(ChecksumError):
        verify_checksum(dest, "md5:" + "1" * 32)


@pytest.fixture()
def http_server():
    with serve_payload("/data.bin", PAYLOAD) as server:
        yield server


def test_http_download_and_range_resume(tmp_path, http_server):
    url, dest = http_server.url + "/data.bin", str(tmp_path / "data.bin")
    download(url, dest, checksum="md5:" + _md5(), progress=False)
    assert http_server.ranges("/data.bin") == [None]
    os.remove(dest)
    _write(dest + ".part", PAYLOAD[:5000])
    download(url, dest, checksum="md5:" + _md5(), progress=False)
    assert http_server.ranges("/data.bin")[-1] == "bytes=5000-"
    with open(dest, "rb") as f:
        assert f.read() == PAYLOAD
    with pytest.raises(DownloadError, match="404"):
        download(http_server.url + "/missing.bin", str(tmp_path / "m.bin"), progress=False, retries=1)


def _make_zip(path, files):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return str(path)


def _make_tgz(path, files):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def test_extract_zip_and_tar_merge_rename_and_skip_rerun(tmp_path):
    dest = tmp_path / "data"
    a = _make_zip(tmp_path / "a.zip", {"root/x/1.txt": b"one", "README": b"r"})
    b = _make_tgz(tmp_path / "b.tgz", {"root/y/2.txt": b"two", "release/z.txt": b"z"})
    extract(a, str(dest), progress=False)
    entries = extract(b, str(dest), rename={"release": "renamed"}, progress=False)
    assert sorted(os.path.basename(e) for e in entries) == ["renamed", "root"]
    assert (dest / "root" / "x" / "1.txt").read_bytes() == b"one"  # merged with the first archive's root/
    assert (dest / "root" / "y" / "2.txt").read_bytes() == b"two"
    assert (dest / "renamed" / "z.txt").read_bytes() == b"z"
    assert not [n for n in os.listdir(dest) if n.startswith(".") and "staging" in n]
    # Re-running is a no-op (a local edit survives) unless overwrite=True.
    (dest / "root" / "x" / "1.txt").write_bytes(b"edited")
    extract(a, str(dest), progress=False)
    assert (dest / "root" / "x" / "1.txt").read_bytes() == b"edited"
    extract(a, str(dest), overwrite=True, progress=False)
    assert (dest / "root" / "x" / "1.txt").read_bytes() == b"one"


def test_extract_corrupt_or_unsafe_archive_leaves_no_partial_output(tmp_path):
    good = _make_tgz(tmp_path / "good.tgz", {f"ds/f{i}.bin": os.urandom(20000) for i in range(5)})
    truncated = tmp_path / "bad.tgz"
    truncated.write_bytes(open(good, "rb").read()[:30000])
    dest = tmp_path / "data"
    with pytest.raises(ValueError, match="bad.tgz.*corrupt"):
        extract(str(truncated), str(dest), progress=False)
    assert os.listdir(dest) == []
    evil = _make_zip(tmp_path / "evil.zip", {"../escape.txt": b"x"})
    with pytest.raises(ValueError, match="outside the destination"):
        extract(evil, str(dest), progress=False)
    assert not (tmp_path / "escape.txt").exists() and os.listdir(dest) == []
    not_archive = _write(tmp_path / "plain.zip", b"just bytes")
    with pytest.raises(ValueError, match="not a zip or tar"):
        extract(not_archive, str(dest), progress=False)


def test_staged_dir_is_all_or_nothing(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_dir(str(final)) as staging:
            (open(os.path.join(staging, "half.txt"), "w")).close()
            raise RuntimeError("killed")
    assert not final.exists() and os.listdir(tmp_path) == []
    with staged_dir(str(final)) as staging:
        open(os.path.join(staging, "done.txt"), "w").close()
    assert (final / "done.txt").exists()
    with staged_dir(str(final)) as staging:  # someone else finished first: theirs is kept
        open(os.path.join(staging, "other.txt"), "w").close()
    assert sorted(os.listdir(final)) == ["done.txt"]
    with staged_dir(str(final), replace=True) as staging:
        open(os.path.join(staging, "new.txt"), "w").close()
    assert sorted(os.listdir(final)) == ["new.txt"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_staged_dir_replace_puts_the_old_folder_back_when_the_new_one_cannot_move_in(tmp_path, monkeypatch):
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("kept")
    real_replace = os.replace

    def failing_replace(src, dst):
        if ".tmp-" in os.path.basename(src):  # the finished staging folder's move: a full disk, a quota
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        with staged_dir(str(final), replace=True) as staging:
            open(os.path.join(staging, "new.txt"), "w").close()
    assert (final / "old.txt").read_text() == "kept" and sorted(os.listdir(tmp_path)) == ["out"]
