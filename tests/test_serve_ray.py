"""`vitkit serve --ray`: the same app as a Ray Serve deployment (serve.batch) on a local Ray instance bound to
127.0.0.1; skipped with the reason where Ray Serve is not installed."""
import concurrent.futures

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from vitkit.serve.ray import ray_serve_installed  # noqa: E402

if not ray_serve_installed():
    pytest.skip("Ray Serve is not installed (pip install 'ray[serve]')", allow_module_level=True)

import vitkit  # noqa: E402
from _serve import LABELS, free_port, image_bytes, tiny_checkpoint  # noqa: E402
from vitkit.checkpoints import load_weights  # noqa: E402
from vitkit.serve.app import ServeOptions  # noqa: E402


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    from vitkit.serve.ray import deploy

    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("ray") / "tiny")
    port = free_port()
    opts = ServeOptions(engine="torch", engine_budget_s=0, max_batch=8, max_wait_ms=200, token="ray-token")
    try:
        deploy(str(ckpt), host="127.0.0.1", port=port, options=opts, replicas=1,
               ray_actor_options={"num_cpus": 0})
        yield f"http://127.0.0.1:{port}", ckpt
    finally:
        import ray  # imported by deploy, after it set Ray's loopback mode
        from ray import serve
        serve.shutdown()
        ray.shutdown()


def test_ray_deployment_classifies_in_batches(ray_server, tmp_path):
    url, ckpt = ray_server
    auth = {"Authorization": "Bearer ray-token"}
    assert httpx.get(url + "/readyz", timeout=30).status_code == 200
    info = httpx.get(url + "/v1/model", headers=auth, timeout=30).json()
    assert info["labels"] == LABELS and info["engine"]["name"] == "torch"
    assert httpx.get(url + "/v1/model", timeout=30).status_code == 401  # the app's token rules hold under Ray

    images = [image_bytes(seed=s) for s in range(6)]
    for i, data in enumerate(images):
        (tmp_path / f"{i}.png").write_bytes(data)
    want = vitkit.classify(load_weights(ckpt), [tmp_path / f"{i}.png" for i in range(6)], topk=2, progress=False)

    def one(data):
        r = httpx.post(url + "/v1/classify?topk=2", content=data, headers={**auth, "Content-Type": "image/png"},
                       timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["results"][0]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        rows = list(pool.map(one, images))
    for row, pred in zip(rows, want):
        assert [t["label"] for t in row["top"]] == [t["label"] for t in pred.top]
        assert abs(row["top"][0]["prob"] - pred.top[0]["prob"]) < 1e-5
    assert max(r["batch"]["size"] for r in rows) > 1  # serve.batch coalesced concurrent requests
    bad = httpx.post(url + "/v1/classify", content=b"not an image", headers={**auth, "Content-Type": "image/png"},
                     timeout=30)
    assert bad.status_code == 415 and bad.json()["error"] == "not_an_image"
