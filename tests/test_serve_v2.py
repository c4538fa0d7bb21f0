"""`vitkit serve` speaking the Open Inference Protocol (v2: KServe, Triton, MLServer): a real uvicorn server on
a loopback port, called as a KServe client does (plain JSON over HTTP), and with tritonclient when it is
installed. The logits are eager PyTorch's; the limits, the token rule and the batcher are /v1's; hostile
requests get the protocol's ``{"error": ...}``."""
import base64
import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from _serve import image_bytes, serving, tiny_checkpoint  # noqa: E402
from vitkit.checkpoints import load_weights  # noqa: E402
from vitkit.predict import create_transform  # noqa: E402
from vitkit.serve.app import create_app  # noqa: E402

OPTS = dict(engine="torch", engine_budget_s=0, max_batch=8, max_wait_ms=1500, max_bytes=1024 * 1024,
            max_images=4, read_timeout_s=1.0, body_timeout_s=5.0, max_pixels=10_000_000, model_id="tiny")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("serve-v2") / "tiny")


@pytest.fixture(scope="module")
def model(ckpt):
    return load_weights(ckpt).eval()


@pytest.fixture(scope="module")
def server(ckpt):
    with serving(create_app(str(ckpt), **OPTS), ready="/v2/health/ready") as srv:
        yield srv


def _infer(url, inputs, outputs=None, rid=None, **kw):
    body = {"inputs": inputs, **({"outputs": [{"name": n} for n in outputs]} if outputs else {}),
            **({"id": rid} if rid else {})}
    return httpx.post(url + "/v2/models/tiny/infer", json=body, timeout=60, **kw)


def _tensor(x, name="pixels", datatype="FP32"):
    return {"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.reshape(-1).tolist()}


def _output(answer, name):
    (out,) = [o for o in answer["outputs"] if o["name"] == name]
    assert out["datatype"] == "FP32"
    return torch.tensor(out["data"]).reshape(out["shape"])


def _rel(got, want):
    return float((got - want).abs().max() / want.abs().max())


def test_health_and_metadata(server):
    assert httpx.get(server.url + "/v2/health/live").json() == {"live": True}
    assert httpx.get(server.url + "/v2/health/ready").json() == {"ready": True}
    assert httpx.get(server.url + "/v2").json()["name"] == "vitkit"
    assert httpx.get(server.url + "/v2/models/tiny/ready").json() == {"name": "tiny", "ready": True}
    meta = httpx.get(server.url + "/v2/models/tiny").json()
    assert meta["name"] == "tiny" and meta["platform"] == "vitkit_torch"
    assert meta["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 3, 32, 32]},
                              {"name": "images", "datatype": "BYTES", "shape": [-1]}]
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {"logits": [-1, 5], "probabilities": [-1, 5],
                                                                "features": [-1, 64]}
    unknown = httpx.get(server.url + "/v2/nothing")  # an unknown path under /v2 answers in the protocol's form too
    assert unknown.status_code == 404 and unknown.json() == {"error": "not_found: no such path: /v2/nothing "
                                                                      "(see /openapi.json)"}
    missing = httpx.get(server.url + "/v2/models/other")
    assert missing.status_code == 404 and list(missing.json()) == ["error"]
    assert missing.json()["error"].startswith("model_not_found:") and "'tiny'" in missing.json()["error"]


def test_tensor_input_gives_eager_logits(server, model):
    torch.manual_seed(1)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    r = _infer(server.url, [_tensor(x)], rid="req-7")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model_name"] == "tiny" and answer["id"] == "req-7"
    logits, probs = _output(answer, "logits"), _output(answer, "probabilities")
    assert logits.shape == (3, 5) and want.std() > 0.1
    assert _rel(logits, want) < 1e-3
    torch.testing.assert_close(probs, want.softmax(-1), rtol=1e-3, atol=1e-5)
    # nested data (as the shape) is the same tensor; asking for one output gives that one
    nested = {"name": "pixels", "shape": [3, 3, 32, 32], "datatype": "FP32", "data": x.tolist()}
    only = _infer(server.url, [nested], outputs=["features"]).json()
    assert [o["name"] for o in only["outputs"]] == ["features"]
    with torch.no_grad():
        feats = model.forward_head(model.forward_features(x), pre_logits=True)
    assert _rel(_output(only, "features"), feats) < 1e-3


def test_bytes_input_gives_eager_logits_with_the_models_preprocessing(server, model):
    imgs = [image_bytes("PNG", (80, 60), seed=3), image_bytes("JPEG", (45, 90), seed=4)]
    pre = create_transform(model)
    x = torch.stack([pre(Image.open(io.BytesIO(b))) for b in imgs])
    with torch.no_grad():
        want = model(x)
    data = [base64.b64encode(b).decode("ascii") for b in imgs]
    r = _infer(server.url, [{"name": "images", "shape": [2], "datatype": "BYTES", "data": data}])
    assert r.status_code == 200, r.text
    assert _rel(_output(r.json(), "logits"), want) < 1e-3


def _send_together(server):
    answers = {}
    x = torch.randn(2, 3, 32, 32)
    v2 = threading.Thread(target=lambda: answers.setdefault("v2", _infer(server.url, [_tensor(x)])))
    v1 = threading.Thread(target=lambda: answers.setdefault("v1", httpx.post(
        server.url + "/v1/classify", content=image_bytes(), headers={"Content-Type": "image/png"}, timeout=60)))
    v2.start()
    v1.start()
    v2.join(60)
    v1.join(60)
    batch = answers["v1"].json()["results"][0]["batch"]
    return answers["v2"].json()["parameters"]["batches"], batch


def test_v1_and_v2_requests_share_one_batch(server):
    """The same batcher: a v2 request (2 tensors) and a /v1 request (1 image) sent together run in one batch.
    Sent together means within the batcher's wait; on a loaded machine one try can miss it, so up to 3 tries
    (each answer is checked: a request never runs in a batch it does not report)."""
    for _ in range(3):
        v2_batches, batch = _send_together(server)
        assert len(v2_batches) >= 1 and batch["size"] >= 1
        if v2_batches == [batch["id"]] and batch["size"] == 3:
            return
    raise AssertionError(f"3 tries and the two requests never shared a batch: last {v2_batches} vs {batch}")


HOSTILE = [  # (what, request body or (content, headers), status, error code)
    ("wrong shape", {"inputs": [_tensor(np.zeros((1, 3, 16, 16), np.float32))]}, 400, "bad_shape"),
    ("wrong channels", {"inputs": [_tensor(np.zeros((1, 1, 32, 32), np.float32))]}, 400, "bad_shape"),
    ("too few values", {"inputs": [{"name": "pixels", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                    "data": [0.0] * 100}]}, 400, "bad_shape"),
    ("negative shape", {"inputs": [{"name": "pixels", "shape": [-1, 3, 32, 32], "datatype": "FP32",
                                    "data": []}]}, 400, "bad_shape"),
    ("wrong datatype", {"inputs": [_tensor(np.zeros((1, 3, 32, 32), np.int64), datatype="INT64")]}, 400,
     "bad_datatype"),
    ("strings as FP32", {"inputs": [{"name": "pixels", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                     "data": ["x"] * 3072}]}, 400, "bad_data"),
    ("NaN", (b'{"inputs": [{"name": "pixels", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [NaN'
             + b", 0" * 3071 + b"]}]}", {"Content-Type": "application/json"}), 400, "not_finite"),
    ("too many images", {"inputs": [_tensor(np.zeros((5, 3, 32, 32), np.float32))]}, 413, "too_many_images"),
    ("bad base64", {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": ["%%%not base64"]}]},
     400, "bad_base64"),
    ("base64 of text", {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES",
                                    "data": [base64.b64encode(b"hello world").decode()]}]}, 415, "not_an_image"),
    ("BYTES count", {"inputs": [{"name": "images", "shape": [2], "datatype": "BYTES", "data": ["AAAA"]}]}, 400,
     "bad_shape"),
    ("two inputs", {"inputs": [_tensor(np.zeros((1, 3, 32, 32), np.float32))] * 2}, 400, "bad_inputs"),
    ("no inputs", {"outputs": [{"name": "logits"}]}, 400, "bad_inputs"),
    ("unknown output", {"inputs": [_tensor(np.zeros((1, 3, 32, 32), np.float32))], "outputs": [{"name": "x"}]},
     400, "bad_output"),
    ("not JSON", (b"{not json", {"Content-Type": "application/json"}), 400, "bad_json"),
    ("not JSON at all", (image_bytes(), {"Content-Type": "image/png"}), 415, "unsupported_content_type"),
    ("binary extension", (b"{}", {"Content-Type": "application/json", "Inference-Header-Content-Length": "2"}), 400,
     "binary_data_unsupported"),
    ("oversize", (b"[" + b"0.0," * 300_000 + b"0]", {"Content-Type": "application/json"}), 413, "too_large"),
]


@pytest.mark.parametrize("what, body, status, code", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_requests_get_the_protocols_error(server, what, body, status, code):
    if isinstance(body, tuple):
        r = httpx.post(server.url + "/v2/models/tiny/infer", content=body[0], headers=body[1], timeout=30)
    else:
        r = httpx.post(server.url + "/v2/models/tiny/infer", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and r.json()["error"].startswith(code + ": "), r.text
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200  # and the server still serves


def test_token_rule_and_feature_extractor(tmp_path):
    """The token guards /v2/models/* as it guards /v1/* (the health probes stay open); a model without a
    classifier answers its features and refuses logits."""
    ckpt = tiny_checkpoint(tmp_path / "feats", num_classes=0)
    with serving(create_app(str(ckpt), **OPTS, token="s3cret"), ready="/v2/health/ready") as srv:
        x = torch.randn(1, 3, 32, 32)
        refused = _infer(srv.url, [_tensor(x)])
        assert refused.status_code == 401 and refused.json()["error"].startswith("unauthorized: ")
        assert httpx.get(srv.url + "/v2/models/tiny").status_code == 401
        assert httpx.get(srv.url + "/v2/health/live").status_code == 200
        auth = {"Authorization": "Bearer s3cret"}
        answer = _infer(srv.url, [_tensor(x)], headers=auth).json()
        assert [o["name"] for o in answer["outputs"]] == ["features"]
        with torch.no_grad():
            want = load_weights(ckpt).eval()(x)  # num_classes=0: forward gives the pooled features
        assert _rel(_output(answer, "features"), want) < 1e-3
        logits = _infer(srv.url, [_tensor(x)], outputs=["logits"], headers=auth)
        assert logits.status_code == 409 and logits.json()["error"].startswith("no_classifier: ")
        meta = httpx.get(srv.url + "/v2/models/tiny", headers=auth).json()
        assert [o["name"] for o in meta["outputs"]] == ["features"]


def test_tritonclient_gets_the_logits(server, model):
    """Triton's own HTTP client (JSON tensors: binary_data=False), when it is installed."""
    http = pytest.importorskip("tritonclient.http")
    client = http.InferenceServerClient(server.url[len("http://"):])
    assert client.is_server_live() and client.is_model_ready("tiny")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    inp = http.InferInput("pixels", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    out = http.InferRequestedOutput("logits", binary_data=False)
    result = client.infer("tiny", [inp], outputs=[out])
    with torch.no_grad():
        want = model(torch.from_numpy(x))
    assert _rel(torch.from_numpy(result.as_numpy("logits")), want) < 1e-3
