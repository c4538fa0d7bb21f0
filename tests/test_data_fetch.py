"""`vitkit data fetch fashion-mnist`, for real, offline: a server on 127.0.0.1 (tests/_http_server.py) serves
IDX files this test writes; the command downloads them into the user's data folder, checks each SHA-256,
never leaves a partial or wrong file under a real name, and says in one line what went wrong (a corrupted
file, a 404, no server). The published checksums themselves are checked against Debian's files when they
are installed (the same gzip streams, with the file name and time put back into the gzip header)."""
import gzip
import hashlib
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from _http_server import FileServer
from vitkit.cli import main
from vitkit.data import fashion_mnist, find_idx_dataset, load_idx_split
from vitkit.data.fetch import FASHION_MNIST_SHA256, DataUnavailable, fetch_fashion_mnist
from vitkit.data.idx import DEBIAN_FASHION_MNIST, data_home, fashion_mnist_dirs
from vitkit.errors import DataError, NotFoundError

NAMES = list(FASHION_MNIST_SHA256)
FETCH = ["data", "fetch", "fashion-mnist", "--no-progress", "--timeout", "5"]  # the command, network waits bounded


def idx_gz(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    return gzip.compress(header + arr.astype(np.uint8).tobytes(), mtime=0)


@pytest.fixture
def dataset(tmp_path):
    """The four files (a tiny Fashion-MNIST: 6 train, 4 test images), written to disk, and their digests."""
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    src.mkdir()
    arrays = {"train-images-idx3-ubyte.gz": rng.integers(0, 256, (6, 28, 28)),
              "train-labels-idx1-ubyte.gz": rng.integers(0, 10, (6,)),
              "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (4, 28, 28)),
              "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, (4,))}
    for name, arr in arrays.items():
        (src / name).write_bytes(idx_gz(arr))
    digests = {name: hashlib.sha256((src / name).read_bytes()).hexdigest() for name in NAMES}
    return src, arrays, digests


@pytest.fixture
def server(dataset):
    src, _, _ = dataset
    with FileServer() as s:
        for name in NAMES:
            s.files[f"/fmnist/{name}"] = (src / name).read_bytes()
        yield s


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty user data folder ($VITKIT_DATA_DIR)."""
    monkeypatch.setenv("VITKIT_DATA_DIR", str(tmp_path / "home"))
    return tmp_path / "home"


def real_names(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.is_file())


def test_data_home_follows_the_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("VITKIT_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_home() == tmp_path / "xdg" / "vitkit" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert data_home() == tmp_path / "me" / ".cache" / "vitkit" / "data"
    monkeypatch.setenv("VITKIT_DATA_DIR", str(tmp_path / "d"))
    assert data_home() == tmp_path / "d"
    assert fashion_mnist_dirs() == (Path(DEBIAN_FASHION_MNIST), tmp_path / "d" / "fashion-mnist")


def test_fetch_downloads_checks_and_the_finder_uses_it(server, dataset, home, monkeypatch, capsys):
    _, arrays, digests = dataset
    monkeypatch.setattr("vitkit.data.fetch.FASHION_MNIST_SHA256", digests)
    with pytest.raises(NotFoundError, match="vitkit data fetch fashion-mnist"):
        find_idx_dataset(defaults=[home / "fashion-mnist"])
    t0 = time.monotonic()
    assert main(FETCH + ["--base-url", server.url + "/fmnist"]) == 0
    assert time.monotonic() - t0 < 20
    folder = home / "fashion-mnist"
    assert capsys.readouterr().out.strip() == (f"Fashion-MNIST: 4 files in {folder}, SHA-256 checked; train with "
                                               f"--data fashion-mnist")
    assert real_names(folder) == sorted(NAMES)
    assert [hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in NAMES] == [digests[n] for n in NAMES]
    monkeypatch.setattr("vitkit.data.idx.DEBIAN_FASHION_MNIST", str(home / "no-debian-here"))
    assert find_idx_dataset() == folder  # Debian's folder first, then the user's data folder
    images, labels = load_idx_split("test")
    np.testing.assert_array_equal(images, arrays["t10k-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(labels, arrays["t10k-labels-idx1-ubyte.gz"])
    assert len(fashion_mnist("train")) == 6
    n = len(server.log)
    assert main(FETCH + ["--base-url", server.url + "/fmnist"]) == 0
    assert len(server.log) == n  # already there and checked: nothing fetched again


def test_a_corrupted_file_is_refused_and_never_kept(server, dataset, tmp_path, capsys):
    _, _, digests = dataset
    bad = bytearray(server.files["/fmnist/t10k-images-idx3-ubyte.gz"])
    bad[100] ^= 0xFF
    server.files["/fmnist/t10k-images-idx3-ubyte.gz"] = bytes(bad)
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=r"SHA-256 [0-9a-f]{16}\.\.\. does not match the published "
                                        + digests["t10k-images-idx3-ubyte.gz"][:16]):
        fetch_fashion_mnist(dest, base_url=server.url + "/fmnist", sha256=digests, progress=False, retries=0,
                            timeout=5)
    assert "t10k-images-idx3-ubyte.gz" not in real_names(dest)
    assert not list(dest.glob("*.part"))
    # the command: one line on stderr, exit code 1 (with the published checksums, every served file is wrong)
    code = main(FETCH + ["--dir", str(tmp_path / "cli"), "--base-url", server.url + "/fmnist", "--retries", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("vitkit data: error: ") and "does not match the published" in err
    assert real_names(tmp_path / "cli") == []
    # a file in the folder that does not match: named, with the fix, and left alone
    (dest / "train-images-idx3-ubyte.gz").write_bytes(b"not the file")
    with pytest.raises(DataError, match="delete .*train-images-idx3-ubyte.gz and fetch again"):
        fetch_fashion_mnist(dest, base_url=server.url + "/fmnist", sha256=digests, progress=False, timeout=5)


def test_http_404_names_the_url_and_where_to_save_the_file(server, dataset, tmp_path, capsys):
    _, _, digests = dataset
    del server.files["/fmnist/train-labels-idx1-ubyte.gz"]
    with pytest.raises(DataUnavailable, match=r"train-labels-idx1-ubyte.gz: the server answered HTTP 404 .*save "
                                              r"it as .*out/train-labels-idx1-ubyte.gz"):
        fetch_fashion_mnist(tmp_path / "out", base_url=server.url + "/fmnist/", sha256=digests, progress=False,
                            timeout=5)
    assert server.requests("/fmnist/train-labels-idx1-ubyte.gz") == [None]  # a 404 is not retried
    assert "train-labels-idx1-ubyte.gz" not in real_names(tmp_path / "out")
    assert isinstance(DataUnavailable("x"), FileNotFoundError)


def test_no_server_is_one_line_and_quick(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    code = main(FETCH + ["--dir", str(tmp_path / "out"), "--base-url", f"http://127.0.0.1:{port}/", "--retries", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and time.monotonic() - t0 < 10
    assert len(err.splitlines()) == 1 and "cannot download http://127.0.0.1" in err and "refused" in err.lower()


def test_an_interrupted_download_resumes_and_the_folder_holds_no_partial_file(server, dataset, tmp_path):
    _, _, digests = dataset
    path = "/fmnist/train-images-idx3-ubyte.gz"
    server.cut_once.add(path)  # the connection drops half-way once
    dest = tmp_path / "out"
    fetch_fashion_mnist(dest, base_url=server.url + "/fmnist", sha256=digests, progress=False, retries=1, timeout=5)
    ranges = server.requests(path)
    assert len(ranges) == 2 and ranges[0] is None and ranges[1].startswith("bytes=")  # the second asked for the rest
    assert real_names(dest) == sorted(NAMES) and not list(dest.glob("*.part"))


@pytest.mark.skipif(not Path(DEBIAN_FASHION_MNIST, NAMES[0]).is_file(), reason="Debian's Fashion-MNIST not installed")
def test_published_checksums_are_those_of_zalandos_files_rebuilt_from_debians():
    """Debian's files are Zalando's gzip streams with FNAME and MTIME dropped from the header; putting them
    back must give the published SHA-256 (and Zalando's published MD5) exactly."""
    md5 = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
           "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
           "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
           "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}
    for name in NAMES:
        deb = Path(DEBIAN_FASHION_MNIST, name).read_bytes()
        assert deb[:4] == b"\x1f\x8b\x08\x00"  # gzip, deflate, no flags (Debian's)
        mtime = 1504176606 if name.startswith("train") else 1504176627
        zalando = b"\x1f\x8b\x08\x08" + struct.pack("<I", mtime) + deb[8:10] + name[:-3].encode() + b"\0" + deb[10:]
        assert hashlib.sha256(zalando).hexdigest() == FASHION_MNIST_SHA256[name]
        assert hashlib.md5(zalando).hexdigest() == md5[name]
