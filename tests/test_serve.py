"""`vitkit serve`: a real uvicorn server on a free loopback port with a tiny model - the endpoints, dynamic
batching, the token rules, the limits and the bad-input corpus, SIGTERM with requests in flight, the client
and `vitkit predict --url`."""
import base64
import io
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import vitkit  # noqa: E402
from _serve import LABELS, free_port, image_bytes, raw_request, read_all, rss_mb, serving, tiny_checkpoint  # noqa: E402
from _weights import randomize  # noqa: E402
from vitkit.checkpoints import load_weights  # noqa: E402
from vitkit.cli import main  # noqa: E402
from vitkit.serve import Client, ServeClientError  # noqa: E402
from vitkit.serve.app import ServeOptions, create_app  # noqa: E402
from vitkit.serve.batching import Batcher, QueueFull  # noqa: E402
from vitkit.serve.server import check_exposure, is_loopback, read_token  # noqa: E402

OPTS = dict(engine="torch", engine_budget_s=0, max_batch=8, max_wait_ms=2000, max_bytes=2 * 1024 * 1024,
            max_images=4, read_timeout_s=1.0, body_timeout_s=5.0, max_pixels=10_000_000)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(ckpt):
    with serving(create_app(str(ckpt), **OPTS)) as srv:
        yield srv


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    d = tmp_path_factory.mktemp("photos")
    (d / "a.png").write_bytes(image_bytes("PNG", seed=1))
    (d / "b.jpg").write_bytes(image_bytes("JPEG", (50, 90), seed=2))
    return d


def _multipart(parts, boundary="vitkitTEST"):
    out = b""
    for name, data, ctype in parts:
        fname = name if isinstance(name, bytes) else name.encode()
        out += (b"--" + boundary.encode() + b'\r\nContent-Disposition: form-data; name="file"; filename="' + fname
                + b'"\r\nContent-Type: ' + ctype.encode() + b"\r\n\r\n" + data + b"\r\n")
    return out + b"--" + boundary.encode() + b"--\r\n", f"multipart/form-data; boundary={boundary}"


def _png_header(w, h):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


# --- the endpoints ----------------------------------------------------------------------------------------
def test_classify_matches_vitkit_predict(server, ckpt, photo):
    """The server's answer is vitkit.classify's: the checkpoint's own preprocessing, labels and logits."""
    want = vitkit.classify(load_weights(ckpt), [photo / "a.png", photo / "b.jpg"], topk=3, progress=False)
    raw = httpx.post(server.url + "/v1/classify?topk=3", content=(photo / "a.png").read_bytes(),
                     headers={"Content-Type": "image/png"})
    assert raw.status_code == 200, raw.text
    files = [("file", ("a.png", (photo / "a.png").read_bytes(), "image/png")),
             ("file", ("b.jpg", (photo / "b.jpg").read_bytes(), "image/jpeg"))]
    multi = httpx.post(server.url + "/v1/classify", params={"topk": 3}, files=files)
    assert multi.status_code == 200, multi.text
    body = multi.json()
    assert body["model"] and body["engine"] == "torch" and body["dtype"] == "fp32"
    assert set(body["timing_ms"]) == {"decode", "queue", "compute", "total"}
    rows = [raw.json()["results"][0]] + body["results"]
    for row, pred in zip(rows, [want[0], want[0], want[1]]):
        assert [t["label"] for t in row["top"]] == [t["label"] for t in pred.top]
        assert all(t["label"] in LABELS for t in row["top"])
        np.testing.assert_allclose([t["prob"] for t in row["top"]], [t["prob"] for t in pred.top], atol=1e-5)
        assert row["geometry"] == pred.geometry
    assert [r["file"] for r in body["results"]] == ["a.png", "b.jpg"]


def test_embed_explain_model_and_probes(server, ckpt, photo):
    data = (photo / "a.png").read_bytes()
    emb = httpx.post(server.url + "/v1/embed", content=data, headers={"Content-Type": "image/png"}).json()
    model = load_weights(ckpt)
    x = vitkit.predict.create_transform(model)(Image.open(photo / "a.png").convert("RGB"))[None]
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)[0]
    assert emb["results"][0]["dim"] == 64
    np.testing.assert_allclose(emb["results"][0]["embedding"], want.numpy(), atol=1e-4)

    exp = httpx.post(server.url + "/v1/explain?topk=2", content=data, headers={"Content-Type": "image/png"}).json()
    row = exp["results"][0]
    assert len(row["top"]) == 2
    overlay = Image.open(io.BytesIO(base64.b64decode(row["overlay_png"])))
    assert overlay.format == "PNG" and overlay.size == (32, 32)

    info = httpx.get(server.url + "/v1/model").json()
    assert info["labels"] == LABELS and info["has_classifier"] and info["preprocessing"]["name"] == "torchvision"
    assert info["engine"]["name"] == "torch" and info["dtype"] == "fp32" and info["format"] == "vitkit"
    assert info["config"]["width"] == 64 and info["kernels"]["dtype"] == "float32" and "kernel_plan" in info["kernels"]
    assert info["options"]["token_required"] is False and "token" not in info["options"]
    assert httpx.get(server.url + "/healthz").json() == {"status": "alive"}
    assert httpx.get(server.url + "/readyz").status_code == 200
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("vitkit_requests_total", "vitkit_request_seconds_bucket", "vitkit_batch_size_bucket",
                 "vitkit_queue_depth"):
        assert name in metrics.text
    schema = httpx.get(server.url + "/openapi.json").json()
    paths = {"/v1/classify", "/v1/embed", "/v1/explain", "/v1/model", "/healthz", "/readyz", "/metrics"}
    assert paths <= set(schema["paths"])
    body = schema["paths"]["/v1/classify"]["post"]["requestBody"]["content"]
    assert {"image/*", "multipart/form-data"} <= set(body)
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "vitkit serve" in page.text
    for asset in ("/static/app.js", "/static/style.css", "/favicon.ico"):
        assert httpx.get(server.url + asset).status_code == 200
    assert "http://" not in page.text and "https://" not in page.text  # no CDN: every asset is the server's own
    assert httpx.get(server.url + "/docs").status_code == 404  # FastAPI's docs pages would load a CDN's scripts


def test_two_concurrent_requests_share_one_batch(server):
    """Request B is on its way (its upload half sent) when A arrives: A waits for B (max_wait 2 s), and both
    run in one batch of 2."""
    b_body = image_bytes("PNG", seed=5)
    head = (f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            f"Content-Length: {len(b_body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head + b_body[:20])
        time.sleep(0.2)  # B's handler is reading its body
        answer = {}
        t = threading.Thread(target=lambda: answer.setdefault("a", httpx.post(
            server.url + "/v1/classify", content=image_bytes("PNG", seed=6), headers={"Content-Type": "image/png"},
            timeout=30)))
        t.start()
        time.sleep(0.3)  # A is queued, waiting for B
        s.sendall(b_body[20:])
        b = read_all(s)
        t.join(30)
    b_json = json.loads(b.partition(b"\r\n\r\n")[2])
    a_json = answer["a"].json()
    assert a_json["results"][0]["batch"] == b_json["results"][0]["batch"]
    assert a_json["results"][0]["batch"]["size"] == 2


def test_request_whose_client_left_is_dropped_from_its_batch(server):
    """A's client disconnects while A waits for B (on its way): A's image never runs; B's batch holds B alone."""
    def dropped():
        text = httpx.get(server.url + "/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("vitkit_dropped_images")))

    before = dropped()
    b_body, a_body = image_bytes("PNG", seed=7), image_bytes("PNG", seed=8)
    head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as b:
        b.sendall(head.format(len(b_body)).encode() + b_body[:20])  # B on its way: A's batch waits for it
        time.sleep(0.2)
        a = socket.create_connection(("127.0.0.1", server.port))
        a.sendall(head.format(len(a_body)).encode() + a_body)
        time.sleep(0.3)  # A decoded and queued
        a.close()  # A's client leaves
        time.sleep(0.3)
        b.sendall(b_body[20:])
        answer = json.loads(read_all(b).partition(b"\r\n\r\n")[2])
    assert answer["results"][0]["batch"]["size"] == 1
    assert dropped() == before + 1


def test_lone_request_runs_at_once(server):
    """An idle server does not hold a lone request for max_wait (2 s here)."""
    r = httpx.post(server.url + "/v1/classify", content=image_bytes(), headers={"Content-Type": "image/png"})
    assert r.status_code == 200 and r.json()["timing_ms"]["queue"] < 500


# --- the bad-input corpus ---------------------------------------------------------------------------------
def _corpus(url, port):
    """(name, response-or-raw, expected status, expected error) for every bad input; each is sent once."""
    good_png = image_bytes()
    post = lambda path="/v1/classify", **kw: httpx.post(url + path, timeout=30, **kw)  # noqa: E731
    img = {"Content-Type": "image/png"}
    yield "empty body", post(content=b"", headers=img), 400, "empty_body"
    yield "wrong content type", post(content=b'{"x": 1}', headers={"Content-Type": "application/json"}), 415, \
        "unsupported_content_type"
    yield "no content type", post(content=good_png), 415, "unsupported_content_type"
    yield "truncated png", post(content=good_png[: len(good_png) // 2], headers=img), 422, "undecodable_image"
    body, ctype = _multipart([("zero.png", b"", "image/png")])
    yield "zero-byte image", post(content=body, headers={"Content-Type": ctype}), 400, "empty_image"
    body, ctype = _multipart([("cat.jpg", b"this is text, not a JPEG\n" * 4, "image/jpeg")])
    yield "text as jpeg", post(content=body, headers={"Content-Type": ctype}), 415, "not_an_image"
    yield "1.6 gigapixel png header", post(content=_png_header(40000, 40000), headers=img), 413, "too_many_pixels"
    yield "200 MB declared", raw_request(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                         b"Content-Length: 209715200\r\n\r\n", b"\x89PNG" * 1000), 413, "too_large"
    sent = {"n": 0}

    def stream():  # 200 MB, 1 MiB at a time, chunked: the server stops reading past its 2 MiB limit
        for _ in range(200):
            sent["n"] += 1
            yield b"\0" * (1 << 20)
    try:
        r = post(content=stream(), headers=img)
    except httpx.HTTPError as err:  # the server closed the connection; the answer may be lost with it
        r = err
    yield "200 MB streamed", r, 413, "too_large"
    assert sent["n"] < 100, f"the client got to send {sent['n']} MiB of 200"
    many = b"".join(b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n\r\nx\r\n"
                    for _ in range(10_000)) + b"--B--\r\n"
    yield "10,000 parts", post(content=many, headers={"Content-Type": "multipart/form-data; boundary=B"}), 413, \
        "too_many_images"
    yield "slow upload", raw_request(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                     b"Content-Length: 5000\r\n\r\n", good_png[:100]), 408, "upload_timeout"
    yield "malformed multipart", post(content=b"--nope\r\nnot a part at all\r\n",
                                      headers={"Content-Type": "multipart/form-data; boundary=B"}), 400, None
    yield "multipart without boundary", post(content=b"xx", headers={"Content-Type": "multipart/form-data"}), 400, None
    body, ctype = _multipart([("a.png", good_png, "image/png")], boundary="B")
    yield "no file field", post(content=body.replace(b'name="file"', b'name="image"'),
                                headers={"Content-Type": ctype}), 400, "no_file"
    yield "unknown path", httpx.get(url + "/v3/nothing"), 404, "not_found"
    yield "wrong method", httpx.get(url + "/v1/classify"), 405, "method_not_allowed"
    for k in ("0", "-3", "1000000"):
        yield f"topk={k}", post(params={"topk": k}, content=good_png, headers=img), 400, "bad_topk"
    yield "topk=abc", post(params={"topk": "abc"}, content=good_png, headers=img), 400, "bad_parameter"
    five = [("a.png", good_png, "image/png")] * 5
    body, ctype = _multipart(five)
    yield "5 images (limit 4)", post(content=body, headers={"Content-Type": ctype}), 413, "too_many_images"
    bad_len = raw_request(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                          b"Content-Length: 12\r\nContent-Length: 13\r\n\r\n", b"x" * 13)
    yield "two Content-Lengths", bad_len, 400, None


def _status_and_json(resp):
    if isinstance(resp, bytes):  # a raw HTTP answer
        head, _, body = resp.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1]) if head else 0
        try:
            return status, json.loads(body) if body.startswith(b"{") else None
        except ValueError:
            return status, None
    if isinstance(resp, Exception):
        return 0, None
    is_json = resp.headers.get("content-type", "").startswith("application/json")
    return resp.status_code, resp.json() if is_json else None


def test_bad_input_corpus(server, caplog):
    """Each bad input gets its 4xx JSON {error, detail} and one log line; after each, a good request is
    answered correctly; the memory returns to its level."""
    good = image_bytes(seed=9)
    want = httpx.post(server.url + "/v1/classify", content=good, headers={"Content-Type": "image/png"}).json()
    before = rss_mb()
    seen = []
    corpus = _corpus(server.url, server.port)
    with caplog.at_level(logging.WARNING, logger="vitkit.serve"):
        while True:
            n0 = len(caplog.records)
            try:
                name, resp, status, error = next(corpus)  # sends the bad input
            except StopIteration:
                break
            got, body = _status_and_json(resp)
            if not (name == "200 MB streamed" and got == 0):  # else the client saw the close before the answer
                assert got == status, (name, got, body)
                if got != 400 or error is not None or body is not None:
                    assert body is not None and set(body) == {"error", "detail"} and body["detail"], (name, body)
                    if error:
                        assert body["error"] == error, (name, body)
            faults = [r for r in caplog.records[n0:] if r.name == "vitkit.serve" and r.levelno == logging.WARNING]
            if body is not None:
                assert len(faults) == 1, (name, [r.getMessage() for r in faults])
            again = httpx.post(server.url + "/v1/classify", content=good, headers={"Content-Type": "image/png"})
            assert again.status_code == 200 and again.json()["results"][0]["top"] == want["results"][0]["top"], name
            seen.append(name)
    assert len(seen) >= 20
    assert rss_mb() - before < 80, f"memory grew by {rss_mb() - before:.0f} MB over the corpus"


def test_non_utf8_file_name_is_classified(server):
    """A file name that is not UTF-8 is not the image's fault: it is classified, its name echoed safely."""
    body, ctype = _multipart([(b"\xff\xfe\x80cat.png", image_bytes(), "image/png")])
    r = httpx.post(server.url + "/v1/classify", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 200, r.text
    name = r.json()["results"][0]["file"]
    assert isinstance(name, str) and name.endswith("cat.png")


def test_one_bad_image_names_its_part(server):
    body, ctype = _multipart([("a.png", image_bytes(), "image/png"), ("b.png", b"GIF89a" + b"\0" * 10, "image/png")])
    r = httpx.post(server.url + "/v1/classify", content=body, headers={"Content-Type": ctype})
    assert r.status_code == 422 and r.json()["detail"].startswith("image 2 of 2: b.png")


def test_busy_queue_answers_503_with_retry_after(ckpt):
    with serving(create_app(str(ckpt), **{**OPTS, "max_queue": 2})) as srv:
        body, ctype = _multipart([("a.png", image_bytes(), "image/png")] * 3)
        r = httpx.post(srv.url + "/v1/classify", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 503 and r.json()["error"] == "busy" and int(r.headers["retry-after"]) >= 1
        body, ctype = _multipart([("a.png", image_bytes(), "image/png")] * 2)
        assert httpx.post(srv.url + "/v1/classify", content=body, headers={"Content-Type": ctype}).status_code == 200


def test_batcher_drops_jobs_whose_client_has_gone():
    import asyncio

    seen = []

    async def go():
        b = Batcher(lambda items: (seen.append(list(items)), items)[1], max_batch=4, max_wait_ms=50, max_queue=3)
        b.start()
        b.expect(1)  # a request on its way keeps the first batch open
        f1, f2 = b.submit(["keep", "gone"])
        f2.cancel()  # its client disconnected
        b.expect(-1)
        done = await f1
        with pytest.raises(QueueFull):
            b.submit(["a", "b", "c", "d"])
        await b.stop()
        return done, b.dropped

    done, dropped = asyncio.run(go())
    assert seen == [["keep"]] and done.output == "keep" and done.batch.size == 1 and dropped == 1


# --- models without a classifier ----------------------------------------------------------------------------
def test_feature_extractor_embeds_and_refuses_classify(tmp_path):
    folder = tiny_checkpoint(tmp_path / "features", num_classes=0)
    with serving(create_app(str(folder), **OPTS)) as srv:
        img = {"Content-Type": "image/png"}
        r = httpx.post(srv.url + "/v1/classify", content=image_bytes(), headers=img)
        assert r.status_code == 409 and r.json()["error"] == "no_classifier" and "classifier" in r.json()["detail"]
        e = httpx.post(srv.url + "/v1/embed", content=image_bytes(), headers=img)
        assert e.status_code == 200 and e.json()["results"][0]["dim"] == 64
        x = httpx.post(srv.url + "/v1/explain", content=image_bytes(), headers=img)
        assert x.status_code == 200 and x.json()["results"][0]["top"] is None and x.json()["results"][0]["overlay_png"]
        assert httpx.get(srv.url + "/v1/model").json()["has_classifier"] is False


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"])
def test_descendant_feature_extractors_embed_and_explain(name):
    """DINOv2 with registers and SigLIP's attention pooling, without a head: the embedding is the model's
    pooled features, the rollout runs (registers are prefix tokens)."""
    from vitkit.serve.app import Service
    from vitkit.serve.images import decode

    torch.manual_seed(0)
    model = vitkit.create_model(name, img_size=56 if "14" in name else 64, depth=2, num_classes=0)
    model.meta.preprocessing = {"mean": [0.5], "std": [0.5]}
    service = Service(model, ServeOptions(engine="torch", engine_budget_s=0))
    service.prepare()
    d = decode(image_bytes(), service.pre, max_pixels=10**7)
    embed, explain = service.step([("embed", d), ("explain", d)])
    with torch.no_grad():
        x = service.pre.normalize(d.crop)[None]
        want = model.forward_head(model.forward_features(x), pre_logits=True)[0]
    np.testing.assert_allclose(embed["features"], want.numpy(), atol=1e-4)
    assert service.explain_error is None
    assert Image.open(io.BytesIO(explain["overlay"])).size == tuple(model.config.img_size)[::-1]
    with pytest.raises(Exception, match="no classifier"):
        service.check_classifier("/v1/classify")


def test_grayscale_model_matches_predict(tmp_path):
    """A one-channel model (Fashion-MNIST style): the server converts to luma as vitkit.classify does."""
    torch.manual_seed(1)
    model = vitkit.create_model("Ti/16", img_size=28, patch_size=4, in_chans=1, depth=2, width=64, num_heads=2,
                                mlp_dim=128, num_classes=4)
    randomize(model, std=0.2)
    model.meta.preprocessing = {"mean": [0.286], "std": [0.353]}
    (tmp_path / "x.png").write_bytes(image_bytes(size=(28, 28), seed=4))
    want = vitkit.classify(model, [tmp_path / "x.png"], topk=4, progress=False)[0]
    with serving(create_app(model, **OPTS)) as srv:
        r = httpx.post(srv.url + "/v1/classify?topk=4", content=(tmp_path / "x.png").read_bytes(),
                       headers={"Content-Type": "image/png"})
    got = r.json()["results"][0]["top"]
    assert [t["index"] for t in got] == [t["index"] for t in want.top]
    np.testing.assert_allclose([t["prob"] for t in got], [t["prob"] for t in want.top], atol=1e-5)


def test_model_without_rollout_classifies_and_refuses_explain():
    """An axial-attention ViT has no [tokens, tokens] map to roll out: /v1/explain says so (409), the rest
    serves."""
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, patch_size=8, depth=2, width=64, num_heads=2, mlp_dim=128,
                                num_classes=3, attention="axial", pool="gap", class_token=False)
    model.meta.preprocessing = {"mean": [0.5], "std": [0.5]}
    with serving(create_app(model, **OPTS)) as srv:
        img = {"Content-Type": "image/png"}
        assert httpx.post(srv.url + "/v1/classify", content=image_bytes(), headers=img).status_code == 200
        r = httpx.post(srv.url + "/v1/explain", content=image_bytes(), headers=img)
        assert r.status_code == 409 and r.json()["error"] == "no_rollout" and "axial" in r.json()["detail"]


def test_options_are_checked():
    from vitkit.errors import ConfigError

    for bad in ({"engine": "tensorrt"}, {"dtype": "fp8"}, {"max_batch": 0}, {"max_wait_ms": -1},
                {"device": "gpu0"}, {"token": " "}):
        with pytest.raises(ConfigError):
            ServeOptions(**bad).check()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="not available"):
            ServeOptions(device="cuda").check()


def test_every_option_has_a_flag_with_the_same_default():
    from dataclasses import asdict, fields

    from vitkit.cli import build_parser
    from vitkit.cli.serve import OPTION_FLAGS, options_from_args

    assert set(OPTION_FLAGS) == {f.name for f in fields(ServeOptions)}
    parse = build_parser().parse_args
    assert asdict(options_from_args(parse(["serve", "w"]))) == asdict(ServeOptions())
    opts = options_from_args(parse(["serve", "w", "--body-timeout", "7", "--decode-threads", "3",
                                    "--no-watch-disconnect", "--max-topk", "9", "--read-timeout", "2.5",
                                    "--engine-budget", "0", "--model-id", "pets", "--token-file", "t"]))
    assert (opts.body_timeout_s, opts.decode_threads, opts.watch_disconnect, opts.max_topk) == (7.0, 3, False, 9)
    assert (opts.read_timeout_s, opts.engine_budget_s, opts.model_id, opts.token) == (2.5, 0.0, "pets", None)


def test_engine_that_cannot_serve_is_reported_not_ready(ckpt):
    """A named engine that cannot run the dtype: /healthz answers, /readyz and the API say why (503); the
    command exits 1 with that line (vitkit.serve.server.run's on_failure)."""
    from _serve import ServerThread

    srv = ServerThread(create_app(str(ckpt), **{**OPTS, "engine": "onnxruntime", "dtype": "int8"}))
    srv.thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                r = httpx.get(srv.url + "/readyz", timeout=2)
                if "could not be made ready" in r.text:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert r.status_code == 503 and "onnxruntime" in r.json()["detail"]
        assert httpx.get(srv.url + "/healthz").status_code == 200
        c = httpx.post(srv.url + "/v1/classify", content=image_bytes(), headers={"Content-Type": "image/png"})
        assert c.status_code == 503 and c.json()["error"] == "not_ready"
    finally:
        srv.stop()


def test_mounted_inside_another_app(ckpt):
    """create_app mounts under a prefix: the page's assets and API resolve below it, the token still guards
    the API, and the parent's lifespan runs the app's."""
    import contextlib

    from fastapi import FastAPI

    vit = create_app(str(ckpt), **OPTS, token="tok")

    @contextlib.asynccontextmanager
    async def lifespan(parent):
        async with vit.router.lifespan_context(vit):
            yield

    parent = FastAPI(lifespan=lifespan)
    parent.mount("/vit", vit)
    with serving(parent, ready="/vit/readyz") as srv:
        page = httpx.get(srv.url + "/vit/")
        assert page.status_code == 200 and 'src="static/app.js"' in page.text
        assert httpx.get(srv.url + "/vit/static/app.js").status_code == 200
        assert httpx.get(srv.url + "/vit/v1/model").status_code == 401
        r = httpx.post(srv.url + "/vit/v1/classify", content=image_bytes(),
                       headers={"Content-Type": "image/png", "Authorization": "Bearer tok"})
        assert r.status_code == 200 and r.json()["results"][0]["top"]


# --- the token rules --------------------------------------------------------------------------------------
def test_token_rules(ckpt, monkeypatch, tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.1")
    check_exposure("127.0.0.1", None)
    with pytest.raises(ValueError, match="no token is set.*--insecure"):
        check_exposure("0.0.0.0", None)
    check_exposure("0.0.0.0", None, insecure=True)
    check_exposure("0.0.0.0", "s3cret")
    monkeypatch.delenv("VITKIT_SERVE_TOKEN", raising=False)
    assert read_token(None) is None
    monkeypatch.setenv("VITKIT_SERVE_TOKEN", " from-env ")
    assert read_token(None) == "from-env"
    f = tmp_path / "token"
    f.write_text("from-file\n")
    assert read_token(str(f)) == "from-file"
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(str(f))
    monkeypatch.delenv("VITKIT_SERVE_TOKEN")
    # the command refuses at once, before loading anything
    assert main(["serve", str(ckpt), "--host", "0.0.0.0", "--port", str(free_port())]) == 1

    with serving(create_app(str(ckpt), **OPTS, token="s3cret-token")) as srv:
        img = {"Content-Type": "image/png"}
        missing = httpx.post(srv.url + "/v1/classify", content=image_bytes(), headers=img)
        assert missing.status_code == 401 and missing.json()["error"] == "unauthorized"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.post(srv.url + "/v1/classify", content=image_bytes(),
                           headers={**img, "Authorization": "Bearer s3cret-tokeN"})
        assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
        basic = httpx.get(srv.url + "/v1/model", headers={"Authorization": "Basic czNjcmV0"})
        assert basic.status_code == 401
        assert httpx.get(srv.url + "/metrics").status_code == 401
        ok = httpx.post(srv.url + "/v1/classify", content=image_bytes(),
                        headers={**img, "Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        for public in ("/healthz", "/readyz", "/", "/static/app.js", "/openapi.json"):
            assert httpx.get(srv.url + public).status_code == 200, public
        assert httpx.get(srv.url + "/v1/model", headers={"Authorization": "Bearer s3cret-token"}).json()[
            "options"]["token_required"] is True
        # the client and predict --url with the token
        assert Client(srv.url, token="s3cret-token").classify([image_bytes()])[0]["top"]
        with pytest.raises(ServeClientError) as err:
            Client(srv.url).classify([image_bytes()])
        assert err.value.status == 401


# --- the client ----------------------------------------------------------------------------------------------
def test_client_and_predict_url(server, ckpt, photo, capsys):
    client = Client(server.url, per_request=1)
    rows = client.classify([photo / "a.png", photo / "b.jpg"], topk=2)
    want = vitkit.classify(load_weights(ckpt), [photo / "a.png", photo / "b.jpg"], topk=2, progress=False)
    assert [r["top"][0]["label"] for r in rows] == [p.top[0]["label"] for p in want]
    assert [r["file"] for r in rows] == ["a.png", "b.jpg"]
    assert client.embed([photo / "a.png"])[0]["dim"] == 64
    assert client.model()["id"] and client.ready()
    (photo / "bad.png").write_bytes(b"not an image")
    code = main(["predict", str(photo / "a.png"), str(photo / "bad.png"), "--url", server.url, "--json", "--topk", "2"])
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 3  # one of two classified
    assert out[0]["top"][0]["label"] == want[0].top[0]["label"] and "not an image" in out[1]["error"]
    with pytest.raises(ServeClientError, match="cannot reach"):
        Client(f"http://127.0.0.1:{free_port()}", timeout=2).classify([photo / "a.png"])
    assert main(["predict", str(photo / "a.png")]) == 2  # neither --weights nor --url


# --- SIGTERM: stop accepting, finish the accepted requests, exit 0 ---------------------------------------------
def test_sigterm_drains_in_flight_requests(ckpt):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "vitkit", "serve", str(ckpt), "--port", str(port), "--engine",
                             "torch", "--max-wait-ms", "1"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        deadline, ready = time.monotonic() + 180, False  # a loaded CI machine starts the server slowly
        while time.monotonic() < deadline and not ready and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ready, f"the server never became ready (exit code {proc.poll()})"
        body = image_bytes(seed=3)
        head = (f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        socks = []
        for _ in range(3):  # three requests accepted, their uploads half sent
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.sendall(head + body[:30])
            socks.append(s)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):  # no new connections
            socket.create_connection(("127.0.0.1", port), timeout=2).sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        answers = []
        for s in socks:
            s.sendall(body[30:])
            answers.append(read_all(s))
            s.close()
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:80] for a in answers]
        assert proc.wait(timeout=30) == 0
        log = proc.stderr.read().decode()
        assert "SIGTERM" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_run_folder_is_served_under_its_recipe_with_its_architecture(tmp_path):
    """The page's title is the model's name and architecture: a training run's RUN/model is served as its
    recipe (not as 'model', the folder's name); /v1/model describes the preprocessing that runs."""
    from vitkit.serve.service import Service

    run = tmp_path / "demo"
    tiny_checkpoint(run / "model")
    (run / "results.json").write_text(json.dumps({"recipe": "fmnist-demo", "model": str(run / "model")}))
    (run / "recipe.yaml").write_text("name: fmnist-demo\ndata: {dataset: fashion-mnist}\n")
    info = Service(load_weights(run / "model"), ServeOptions(engine="torch")).model_info()
    assert info["id"] == "fmnist-demo"
    assert info["title"] == "fmnist-demo · ViT (width 64, depth 2, 2 heads, MLP 128, patch 8) at 32x32 px"
    assert info["preprocessing_summary"] == ("torchvision IMAGENET1K_V1: shorter side 36 bilinear (antialiased), "
                                             "centre crop 32, ImageNet mean/std")
    (run / "results.json").unlink()  # a folder no run wrote: its config's name
    assert Service(load_weights(run / "model"), ServeOptions(engine="torch")).model_info()["id"] == "Ti/16"
