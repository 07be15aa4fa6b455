"""``python -m dml_jax.data.prepare``: the counts check, and ``--download`` against a real HTTP
server on 127.0.0.1 serving generated archives in the official layouts (resume after a
truncated transfer, restart when the server ignores ranges, wrong checksums, extraction)."""

import contextlib
import dataclasses
import hashlib
import http.server
import io
import os
import tarfile
import threading
import zipfile

import pytest

from dml_jax.data import official, prepare
from dml_jax.data.official import download as download_lib
from dml_jax.data.official.sources import SOURCES
from official_files import (real_data, write_cars, write_cub, write_flowers, write_mnist,
                            write_omniglot, write_sop)


class Handler(http.server.BaseHTTPRequestHandler):
  """Serves ``server.files`` with ``Range`` support; ``server.truncate[path]`` responses of
  that path send the full ``Content-Length`` but only half the bytes (then close)."""

  def do_GET(self):  # pylint: disable=invalid-name
    server = self.server
    path = self.path.lstrip("/")
    server.requests.append((path, self.headers.get("Range")))
    if path not in server.files:
      self.send_error(404)
      return
    data = server.files[path]
    start = 0
    ranged = self.headers.get("Range")
    if ranged and not server.ignore_range:
      start = int(ranged.split("=")[1].split("-")[0])
      self.send_response(206)
      self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    else:
      self.send_response(200)
    body = data[start:]
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if server.truncate.get(path, 0) > 0:
      server.truncate[path] -= 1
      body = body[:len(body) // 2]
    self.wfile.write(body)

  def log_message(self, *args):  # keep the test output clean
    pass


@contextlib.contextmanager
def serve(files):
  """A threaded HTTP server on 127.0.0.1 serving ``files`` (name -> bytes); yields it
  (``server.url``, ``server.requests``, ``server.truncate``, ``server.ignore_range``)."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  server.files, server.requests, server.truncate, server.ignore_range = dict(files), [], {}, False
  server.url = f"http://127.0.0.1:{server.server_address[1]}"
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                            daemon=True)
  thread.start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def _tar(folder, *entries):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for entry in entries:
      tar.add(os.path.join(folder, entry), arcname=entry)
  return buffer.getvalue()


def _zip(folder, entry):
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as z:
    for directory, _, names in os.walk(os.path.join(folder, entry)):
      for n in names:
        path = os.path.join(directory, n)
        z.write(path, os.path.relpath(path, folder))
  return buffer.getvalue()


def _read(folder, name):
  with open(os.path.join(folder, name), "rb") as f:
    return f.read()


def official_archives(name, folder):
  """Generated files of benchmark ``name`` packed as its official archives: name -> bytes."""
  if name == "omniglot":
    write_omniglot(folder)
    return {f: _read(folder, f) for f in ("images_background.zip", "images_evaluation.zip")}
  if name == "mnist":
    write_mnist(folder)
    return {a.filename: _read(folder, a.filename) for a in SOURCES["mnist"].archives}
  if name == "cub":
    write_cub(folder)
    return {"CUB_200_2011.tgz": _tar(folder, "CUB_200_2011")}
  if name == "flowers102":
    write_flowers(folder)
    return {"102flowers.tgz": _tar(folder, "jpg"), "imagelabels.mat": _read(folder,
                                                                           "imagelabels.mat"),
            "setid.mat": _read(folder, "setid.mat")}
  if name == "sop":
    write_sop(folder)
    return {"Stanford_Online_Products.zip": _zip(folder, "Stanford_Online_Products")}
  assert name == "cars196"
  write_cars(folder, layout="devkit")
  return {"cars_train.tgz": _tar(folder, "cars_train"), "cars_test.tgz": _tar(folder, "cars_test"),
          "car_devkit.tgz": _tar(folder, "devkit"),
          "cars_test_annos_withlabels.mat": _read(folder, "cars_test_annos_withlabels.mat")}


def sources_for(name, files):
  """``SOURCES`` with ``name``'s checksums replaced by those of the generated ``files``."""
  source = SOURCES[name]
  archives = tuple(dataclasses.replace(a, sha256=hashlib.sha256(files[a.filename]).hexdigest(),
                                       content_md5="") for a in source.archives)
  return {**SOURCES, name: dataclasses.replace(source, archives=archives)}


@pytest.mark.parametrize("name", ["omniglot", "mnist", "cub", "flowers102", "sop", "cars196"])
def test_download_extract_and_read_every_layout(tmp_path, name):
  files = official_archives(name, str(tmp_path / "made"))
  root = str(tmp_path / "root")
  out = io.StringIO()
  with serve(files) as server:
    assert prepare.download(name, root, mirror=server.url + "/", progress=False,
                            sources=sources_for(name, files), out=out)
  parts = official.read_parts(name, root)
  assert sum(len(p) for p in parts.values()) > 0
  left = sorted(os.listdir(root))
  assert not any(f.endswith(".part") or f.startswith(".extracting") for f in left)
  extracted = [a.filename for a in SOURCES[name].archives if a.extract]
  assert not set(extracted) & set(left)           # archives deleted after extraction
  assert "checksum OK (SHA-256)" in out.getvalue()
  # A second run finds everything in place and downloads nothing.
  again = io.StringIO()
  assert prepare.download(name, root, mirror="http://127.0.0.1:9/", progress=False,
                          sources=sources_for(name, files), out=again)
  assert again.getvalue().count("is already in") == len(SOURCES[name].archives)


def test_truncated_transfer_resumes_with_a_range_request(tmp_path):
  files = {"images_background.zip": os.urandom(50_000)}
  dest = str(tmp_path / "images_background.zip")
  archive = dataclasses.replace(SOURCES["omniglot"].archives[0],
                                sha256=hashlib.sha256(files["images_background.zip"]).hexdigest())
  with serve(files) as server:
    server.truncate["images_background.zip"] = 1
    download_lib.fetch(f"{server.url}/images_background.zip", dest, progress=True,
                       check=lambda p: download_lib.verify(p, archive))
  assert server.requests == [("images_background.zip", None),
                             ("images_background.zip", "bytes=25000-")]
  assert _read(str(tmp_path), "images_background.zip") == files["images_background.zip"]
  assert not os.path.exists(dest + ".part")


def test_interrupted_download_leaves_only_a_part_file_and_the_next_run_resumes(tmp_path):
  data = os.urandom(40_000)
  dest = str(tmp_path / "setid.mat")
  with serve({"setid.mat": data}) as server:
    server.truncate["setid.mat"] = 3
    with pytest.raises(download_lib.DownloadError, match=r"failed 3 times.*bytes are kept in "
                       r".*setid\.mat\.part"):
      download_lib.fetch(f"{server.url}/setid.mat", dest, progress=False)
    assert not os.path.exists(dest)                       # nothing that looks complete
    kept = os.path.getsize(dest + ".part")
    assert 0 < kept < len(data)
    download_lib.fetch(f"{server.url}/setid.mat", dest, progress=False)
  assert server.requests[3] == ("setid.mat", f"bytes={kept}-")
  assert _read(str(tmp_path), "setid.mat") == data


def test_server_ignoring_ranges_restarts_the_download(tmp_path):
  data = os.urandom(30_000)
  dest = str(tmp_path / "x.bin")
  with open(dest + ".part", "wb") as f:
    f.write(b"stale bytes of an earlier attempt")
  with serve({"x.bin": data}) as server:
    server.ignore_range = True
    download_lib.fetch(f"{server.url}/x.bin", dest, progress=False)
  assert server.requests == [("x.bin", "bytes=33-")]
  assert _read(str(tmp_path), "x.bin") == data


def test_wrong_checksum_leaves_no_file(tmp_path):
  files = official_archives("mnist", str(tmp_path / "made"))   # not the official files
  root = str(tmp_path / "root")
  out = io.StringIO()
  with serve(files) as server:
    rc = prepare.main(["mnist", f"--root={root}", "--download", f"--mirror={server.url}",
                       "--no_progress"], out=out)
  assert rc == 1
  message = out.getvalue()
  assert f"error: {server.url}/train-images-idx3-ubyte.gz: " in message
  assert "train-images-idx3-ubyte.gz.part: wrong checksum: SHA-256" in message
  assert "It was deleted." in message
  assert "(published 440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609" \
      ")" in message
  assert "MD5 of the decompressed content" in message
  assert os.listdir(root) == []


def test_a_missing_file_on_the_server(tmp_path):
  with serve({}) as server:
    with pytest.raises(download_lib.DownloadError, match="HTTP 404"):
      download_lib.fetch(f"{server.url}/nothing.zip", str(tmp_path / "nothing.zip"),
                         progress=False)


def test_recompressed_gzip_is_accepted_by_the_md5_of_its_content(tmp_path):
  import gzip  # pylint: disable=import-outside-toplevel
  content = os.urandom(5000)
  path = str(tmp_path / "t10k-labels-idx1-ubyte.gz")
  with gzip.open(path, "wb", compresslevel=1) as f:
    f.write(content)
  archive = dataclasses.replace(SOURCES["mnist"].archives[3], sha256="0" * 64,
                                content_md5=hashlib.md5(content).hexdigest())
  assert download_lib.verify(path, archive) == "MD5 of the decompressed content"
  with open(path, "r+b") as f:
    f.truncate(100)
  with pytest.raises(download_lib.ChecksumError, match="damaged or truncated gzip"):
    download_lib.verify(path, archive)


def test_cars_has_no_live_address(tmp_path):
  out = io.StringIO()
  assert prepare.main(["cars196", f"--root={tmp_path}", "--download"], out=out) == 1
  assert "no live official address" in out.getvalue() and "--mirror=URL" in out.getvalue()


def test_check_reports_counts_against_the_published_ones(tmp_path):
  write_mnist(str(tmp_path), per_digit=2)
  out = io.StringIO()
  assert prepare.main(["mnist_evenodd", f"--root={tmp_path}"], out=out) == 1
  report = out.getvalue()
  assert "train               20     60,000       10         10" in report
  assert "20 images, published 60,000" in report and "class 0: 2 images, published 5923" in report
  assert "mnist_evenodd:val" in report and "Some counts differ" in report
  out = io.StringIO()
  assert prepare.main(["cub", f"--root={tmp_path}"], out=out) == 1
  assert "error: CUB-200-2011: 'images.txt' not found" in out.getvalue()


def test_check_on_the_real_files():
  for name, files in (("mnist", ("train-images-idx3-ubyte.gz",)),
                      ("omniglot", ("images_background.zip",))):
    root = real_data(name, *files)
    out = io.StringIO()
    assert prepare.main([name, f"--root={root}"], out=out) == 0, out.getvalue()
    assert "All counts equal the published ones." in out.getvalue()
  real = real_data("mnist", "t10k-labels-idx1-ubyte.gz")   # recompressed: content MD5 matches
  archive = SOURCES["mnist"].archives[3]
  assert download_lib.verify(os.path.join(real, archive.filename), archive) == (
      "MD5 of the decompressed content")


def test_extract_refuses_unsafe_members(tmp_path):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    info = tarfile.TarInfo("../evil.txt")
    info.size = 1
    tar.addfile(info, io.BytesIO(b"x"))
  path = tmp_path / "evil.tgz"
  path.write_bytes(buffer.getvalue())
  (tmp_path / "root").mkdir()
  with pytest.raises(ValueError, match="unsafe member"):
    download_lib.extract(str(path), str(tmp_path / "root"))
  assert not (tmp_path / "evil.txt").exists() and os.listdir(tmp_path / "root") == []
