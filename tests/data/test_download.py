"""Downloads and the downloaded corpora, against a local http.server on 127.0.0.1 only."""

import hashlib
import io
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from posenc_lab.data import DownloadError, load_corpus
from posenc_lab.data.download import download


def make_zip(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def server():
    """Serve `files` {"/path": bytes} on a loopback ephemeral port; "/truncated" announces more than it sends."""
    files, hits = {}, []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path == "/truncated":
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(b"x" * 1000)
                return  # the connection closes after 1000 of the announced 100000 bytes
            if self.path not in files:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(files[self.path])))
            self.end_headers()
            self.wfile.write(files[self.path])

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    httpd.files, httpd.hits = files, hits
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def closed_port_url():
    """A loopback URL nothing listens on (a port just released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


ENWIK8 = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()


def leftovers(directory):
    return sorted(p.name for p in directory.rglob("*.tmp"))


def test_enwik8_download_extract_split_then_cache(server, tmp_path, capsys):
    archive = make_zip({"enwik8": ENWIK8})
    server.files["/enwik8.zip"] = archive
    kw = dict(url=server.url + "/enwik8.zip", expected_size=3000, split_sizes=(2700, 150, 150))
    c = load_corpus("enwik8", root=tmp_path, md5=hashlib.md5(archive).hexdigest(), **kw)
    assert (c.vocab_size, c.unit) == (256, "byte")
    assert (bytes(c.train), bytes(c.val), bytes(c.test)) == (ENWIK8[:2700], ENWIK8[2700:2850], ENWIK8[2850:])
    assert "100%" in capsys.readouterr().err  # progress went to stderr
    assert (tmp_path / "enwik8" / "enwik8").stat().st_size == 3000
    server.files.clear()  # a second load must not need the network
    again = load_corpus("enwik8", root=tmp_path, **kw)
    assert bytes(again.val) == ENWIK8[2700:2850] and server.hits == ["/enwik8.zip"]


def test_url_comes_from_the_environment(server, tmp_path, monkeypatch):
    server.files["/mirror/text8.zip"] = make_zip({"text8": b"ab ba cab " * 100})
    monkeypatch.setenv("POSENC_LAB_TEXT8_URL", server.url + "/mirror/text8.zip")
    c = load_corpus("text8", root=tmp_path, expected_size=1000, split_sizes=(900, 50, 50))
    assert (c.unit, c.itos, c.vocab_size) == ("char", [" ", "a", "b", "c"], 4)
    assert "".join(c.itos[i] for i in c.val) == ("ab ba cab " * 100)[900:950]


def test_checksum_failure_is_clear_and_leaves_nothing(server, tmp_path):
    server.files["/enwik8.zip"] = make_zip({"enwik8": ENWIK8})
    with pytest.raises(DownloadError, match=r"md5 [0-9a-f]{32}, expected 0{32}"):
        load_corpus("enwik8", root=tmp_path, url=server.url + "/enwik8.zip", md5="0" * 32)
    assert not (tmp_path / "enwik8" / "enwik8.zip").exists() and leftovers(tmp_path) == []


def test_unzipped_size_mismatch_is_clear_and_leaves_nothing(server, tmp_path):
    server.files["/enwik8.zip"] = make_zip({"enwik8": ENWIK8})
    with pytest.raises(DownloadError, match="size 3,000 bytes, expected 100,000,000 bytes"):
        load_corpus("enwik8", root=tmp_path, url=server.url + "/enwik8.zip")  # the real expected size
    assert not (tmp_path / "enwik8" / "enwik8").exists() and leftovers(tmp_path) == []


def test_interrupted_download_is_never_taken_as_complete(server, tmp_path):
    dest = tmp_path / "f.zip"
    with pytest.raises(DownloadError, match="incomplete download .*got 1,000 of 100,000 bytes"):
        download(server.url + "/truncated", dest, progress=False)
    assert not dest.exists() and leftovers(tmp_path) == []


def test_offline_error_names_the_url_and_where_to_put_the_file(closed_port_url, tmp_path):
    url = closed_port_url + "/enwik8.zip"
    expect = (
        rf"could not download {url} .*put it at {tmp_path}/enwik8/enwik8.zip "
        rf".*unzipped file `enwik8` at {tmp_path}/enwik8/enwik8\); for a mirror .*POSENC_LAB_ENWIK8_URL"
    )
    with pytest.raises(DownloadError, match=expect):
        load_corpus("enwik8", root=tmp_path, url=url)
    expect = (
        rf"put it at {tmp_path}/wikitext2/wikitext-2-v1.zip \(or the extracted wiki.train.tokens, "
        rf".* in {tmp_path}/wikitext2/wikitext-2\); for a mirror pass url=... or set POSENC_LAB_WIKITEXT2_URL"
    )
    with pytest.raises(DownloadError, match=expect):
        load_corpus("wikitext2", root=tmp_path, url=closed_port_url + "/wikitext-2-v1.zip")


def test_http_error_is_a_download_error(server, tmp_path):
    with pytest.raises(DownloadError, match="404"):
        download(server.url + "/missing.zip", tmp_path / "m.zip", progress=False)


WT_TRAIN = " = Title = \n\n the cat sat on the mat \n the <unk> sat \n"
WT_VALID = " the dog sat \n"
WT_TEST = "\n the cat \n"


def test_wikitext_word_level_vocab_from_train(server, tmp_path):
    server.files["/wikitext-2-v1.zip"] = make_zip(
        {
            "wikitext-2/wiki.train.tokens": WT_TRAIN,
            "wikitext-2/wiki.valid.tokens": WT_VALID,
            "wikitext-2/wiki.test.tokens": WT_TEST,
        }
    )
    c = load_corpus("wikitext2", root=tmp_path, url=server.url + "/wikitext-2-v1.zip")
    assert c.unit == "word" and c.vocab_size == len(c.itos) == 9
    assert c.itos[:4] == ["<eos>", "the", "=", "sat"]  # most frequent first, ties by first appearance
    words = lambda a: [c.itos[i] for i in a]  # noqa: E731
    assert words(c.train) == [
        "=",
        "Title",
        "=",
        "<eos>",
        "<eos>",
        "the",
        "cat",
        "sat",
        "on",
        "the",
        "mat",
        "<eos>",
        "the",
        "<unk>",
        "sat",
        "<eos>",
    ]
    assert words(c.val) == ["the", "<unk>", "sat", "<eos>"]  # "dog" is not in train
    assert words(c.test) == ["<eos>", "the", "cat", "<eos>"]
    assert c.train.dtype == np.int32
    server.files.clear()
    assert load_corpus("wikitext2", root=tmp_path, url=server.url + "/wikitext-2-v1.zip").itos == c.itos
