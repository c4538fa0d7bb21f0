"""The model holder: one model behind a batcher, independent of HTTP. It chooses the engine and warms the
model up on the inference thread, decodes and checks the uploads on the decode threads, queues the images
and writes the answers."""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError
from ..variants import architecture
from .batching import Batcher, Done, QueueFull
from .faults import ClientGone, Fault
from .images import BadImage, Decoded, decode, overlay_png
from .metrics import Metrics
from .options import ServeOptions

log = logging.getLogger("vitkit.serve")


def default_model_id(source: Optional[str], name: Optional[str] = None) -> str:
    """The name a model is served under without ``--model-id``: the recipe of the training run that wrote the
    folder (``RUN/model`` -> ``fmnist-demo``), else the config's ``name`` (``B/16``), else the file or folder
    name."""
    from ..checkpoints.push import training_run

    path = Path(str(source or "model"))
    run = training_run(path) if path.is_dir() else None
    recipe = run["results"].get("recipe") if run else None
    return str(recipe or name or path.name)


class Service:
    """One model behind a batcher: decoding, inference and the answers, independent of HTTP."""

    def __init__(self, model, options: Optional[ServeOptions] = None,
                 batcher_factory: Optional[Callable[["Service"], Any]] = None):
        from ..predict import create_transform

        self.options = (options or ServeOptions()).check()
        self.model = model.eval().requires_grad_(False).to(self.options.device)
        self.config = model.config
        self.meta = model.meta
        self.pre = create_transform(model, self.options.preset)
        if self.config.in_chans not in (1, 3):
            raise ConfigError(f"images have 3 (RGB) or 1 (gray) channels; the model takes {self.config.in_chans}",
                              key="in_chans")
        self.gray = self.config.in_chans == 1
        self.labels = list(self.meta.labels) if self.meta.labels else None
        self.has_classifier = self.config.num_classes > 0
        self.model_id = self.options.model_id or default_model_id(self.meta.source, self.config.name)
        self.engine = None
        self.engine_report: Dict[str, Any] = {}
        self.explain_error: Optional[str] = None
        self.kernels: Optional[Dict[str, Any]] = None
        self.ready = False
        self.failed: Optional[str] = None
        self.batcher = None
        self._batcher_factory = batcher_factory
        self.decoder = concurrent.futures.ThreadPoolExecutor(self.options.decode_threads,
                                                             thread_name_prefix="vitkit-decode")
        self.metrics = Metrics(self)
        self.on_failure: Optional[Callable[[str], None]] = None

    # --- life cycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the batcher and, on the inference thread, choose the engine and warm it up."""
        o = self.options
        if self._batcher_factory is not None:
            self.batcher = self._batcher_factory(self)
        else:
            self.batcher = Batcher(self.step, max_batch=o.max_batch, max_wait_ms=o.max_wait_ms,
                                   max_queue=o.max_queue, on_batch=self._on_batch)
        self.batcher.start()
        try:
            if self.engine is None:  # a host that warmed the model up before serving (Ray) has an engine
                await self.batcher.call(self.prepare)
        except Exception as err:  # noqa: BLE001 - reported by /readyz and the log, and stops the server
            self.failed = f"{type(err).__name__}: {err}"
            log.error("the model could not be made ready: %s", self.failed)
            if self.on_failure is not None:
                self.on_failure(self.failed)
            return
        self.ready = True
        log.info("ready: %s on %s (%s), batches of up to %d within %g ms", self.model_id, self.engine.name,
                 self.engine.dtype, o.max_batch, o.max_wait_ms)

    def prepare(self) -> None:
        """Choose (or build) the engine and warm it up: runs on the inference thread."""
        from .engines import choose_engine, kernel_choices

        o = self.options
        t0 = time.perf_counter()
        budget = o.engine_budget_s if o.engine == "auto" else 0.0
        self.engine, self.engine_report = choose_engine(self.model, o.engine, o.dtype, o.max_batch, budget)
        self.step([("classify", self._blank())])  # warm-up: batch 1, the path a lone request takes
        try:  # the rollout of /v1/explain, once: a model it cannot run is refused there, not mid-batch
            self.step([("explain", self._blank())])
        except Exception as err:  # noqa: BLE001
            self.explain_error = f"{type(err).__name__}: {err}"
            log.warning("/v1/explain is unavailable for this model: %s", self.explain_error)
        self.engine_report["ready_s"] = round(time.perf_counter() - t0, 3)
        self.kernels = kernel_choices(self.engine)
        log.info("engine %s (%s); kernels: %s", self.engine.name, self.engine.dtype, self.kernels)

    def _blank(self) -> Decoded:
        h, w = self.config.img_size
        return Decoded("warm-up", torch.full((3, h, w), 128.0), "-", w, h, "")

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()
        self.decoder.shutdown(wait=False)
        if self.engine is not None:
            self.engine.close()

    def _on_batch(self, info) -> None:
        self.metrics.batch_size.observe(info.size)
        self.metrics.batch_seconds.observe(info.compute_s)

    # --- inference (the inference thread) -----------------------------------------------------------------
    def step(self, items: List[Tuple[str, Decoded]]) -> List[Dict[str, Any]]:
        """One batch: the engine's logits and features for every image, the rollout for the explain ones."""
        from ..predict import normalized

        crops = [d for _, d in items]
        if any(d.normalised for d in crops):  # v2 tensors (the client's preprocessing) beside uploaded images
            x = torch.stack([d.crop if d.normalised else normalized(self.pre, d.crop, self.gray) for d in crops])
        else:
            x = normalized(self.pre, torch.stack([d.crop for d in crops]), self.gray)
        logits, feats = self.engine.run(x)
        out = [{"logits": logits[i], "features": feats[i]} for i in range(len(items))]
        explain = [i for i, (kind, _) in enumerate(items) if kind == "explain"]
        if explain:
            from ..analysis.rollout import normalize_maps, rollout_maps

            p = next(self.model.parameters())
            maps = normalize_maps(rollout_maps(self.model, x[explain].to(p.device, p.dtype)).float().cpu())
            for j, i in enumerate(explain):
                out[i]["overlay"] = overlay_png(items[i][1].crop, maps[j])
        return out

    # --- requests (the event loop) ------------------------------------------------------------------------
    def check_ready(self) -> None:
        if self.failed:
            raise Fault(503, "not_ready", f"the model could not be made ready: {self.failed}")
        if not self.ready:
            raise Fault(503, "not_ready", "the model is still loading or warming up", {"Retry-After": "1"})

    def check_topk(self, topk: int) -> int:
        if not 1 <= topk <= self.options.max_topk:
            raise Fault(400, "bad_topk", f"topk must be between 1 and {self.options.max_topk} (--max-topk), "
                        f"got {topk}")
        return min(topk, max(self.config.num_classes, 1))

    def check_explain(self) -> None:
        if self.explain_error:
            raise Fault(409, "no_rollout", f"{self.model_id}: the attention rollout cannot run on this model "
                        f"({self.explain_error})")

    def check_classifier(self, endpoint: str) -> None:
        if not self.has_classifier:
            raise Fault(409, "no_classifier", f"{self.model_id} has no classifier (num_classes=0: a feature "
                        f"extractor); {endpoint} needs one: use /v1/embed for its features")

    async def decode_all(self, uploads: Sequence[Tuple[str, bytes]]) -> List[Decoded]:
        """Decode and check every upload (on the decode threads); the first bad one refuses the request."""
        loop = asyncio.get_running_loop()
        o = self.options
        jobs = [loop.run_in_executor(self.decoder, lambda d=data, n=name: decode(d, self.pre, name=n,
                                                                                  max_pixels=o.max_pixels))
                for name, data in uploads]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BadImage):
                which = f"image {i + 1} of {len(uploads)}: " if len(uploads) > 1 else ""
                raise Fault(r.status, r.error, which + r.detail)
            if isinstance(r, BaseException):
                raise r
        return list(results)

    async def infer(self, kind: str, decoded: List[Decoded], watch: Optional[Callable[[], Any]] = None) -> List[Done]:
        """Queue the images and wait for their results; ``watch``: an awaitable factory that returns when the
        client has gone (the images are then dropped from their batch, :class:`ClientGone` raised)."""
        try:
            futures = self.batcher.submit([(kind, d) for d in decoded])
        except QueueFull as err:
            raise Fault(503, "busy", str(err), {"Retry-After": str(err.retry_after)}) from None
        gathered = asyncio.gather(*futures)
        if watch is None:
            return await gathered
        gone = asyncio.ensure_future(watch())
        try:
            done, _ = await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            gathered.cancel()
            raise
        finally:
            gone.cancel()
        if gathered in done:
            return gathered.result()
        gathered.cancel()  # cancels every image's future: the batcher drops them
        raise ClientGone()

    def answer(self, kind: str, decoded: List[Decoded], done: List[Done], k: int, t_start: float,
               decode_s: float) -> Dict[str, Any]:
        from ..predict import top_classes

        results = []
        for d, r in zip(decoded, done):
            row: Dict[str, Any] = {"file": d.name, "width": d.width, "height": d.height, "format": d.format,
                                   "geometry": d.geometry, "batch": {"id": r.batch.id, "size": r.batch.size}}
            if kind in ("classify", "explain") and self.has_classifier:
                top = top_classes(torch.from_numpy(np.asarray(r.output["logits"]))[None], k, self.labels)[0]
                if top is None:
                    raise Fault(500, "not_finite", "the model's output is not finite (NaN or Inf): its weights hold "
                                "non-finite values or overflow")
                row["top"] = top
            if kind == "explain":
                row["top"] = row.get("top")
                row["overlay_png"] = base64.b64encode(r.output["overlay"]).decode("ascii")
            if kind == "embed":
                feats = np.asarray(r.output["features"], dtype=np.float32)
                row["dim"] = int(feats.shape[-1])
                row["embedding"] = [round(float(v), 6) for v in feats.tolist()]
            results.append(row)
        queue = max((r.queue_s for r in done), default=0.0)
        compute = sum({r.batch.id: r.batch.compute_s for r in done}.values())
        return {"model": self.model_id, "engine": self.engine.name, "dtype": self.engine.dtype, "results": results,
                "timing_ms": {"decode": round(decode_s * 1e3, 3), "queue": round(queue * 1e3, 3),
                              "compute": round(compute * 1e3, 3),
                              "total": round((time.perf_counter() - t_start) * 1e3, 3)}}

    # --- the Open Inference Protocol (v2) ------------------------------------------------------------------
    def v2_outputs(self) -> Dict[str, List[int]]:
        """The outputs a v2 request may ask for, with their shapes (-1: the batch)."""
        cfg = self.config
        out = {"features": [-1, cfg.representation_size or cfg.width]}
        if self.has_classifier:
            out = {"logits": [-1, cfg.num_classes], "probabilities": [-1, cfg.num_classes], **out}
        return out

    def check_v2_outputs(self, names: Sequence[str]) -> None:
        missing = [n for n in names if n not in self.v2_outputs()]
        if missing:
            self.check_classifier(f"the output {missing[0]!r}")

    def v2_metadata(self) -> Dict[str, Any]:
        """GET /v2/models/{id}: the inputs (FP32 pixels preprocessed as /v1/model says, or BYTES images) and
        the outputs, with their datatypes and shapes (-1: any batch size)."""
        c, (h, w) = self.config.in_chans, self.config.img_size
        engine = self.engine.name if self.engine is not None else self.options.engine
        return {"name": self.model_id, "versions": [], "platform": f"vitkit_{engine}",
                "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, c, h, w]},
                           {"name": "images", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": n, "datatype": "FP32", "shape": shape} for n, shape in self.v2_outputs().items()]}

    def tensor_items(self, name: str, pixels: np.ndarray) -> List[Decoded]:
        """A v2 FP32 input [N, C, H, W] as batch items (already the model's input: not normalised again)."""
        n, _, h, w = pixels.shape
        x = torch.from_numpy(np.ascontiguousarray(pixels))
        return [Decoded(f"{name[:40]}[{i}]", x[i], "tensor", w, h, "preprocessed by the client", normalised=True)
                for i in range(n)]

    def answer_v2(self, request_id: Optional[str], names: Sequence[str], done: List[Done]) -> Dict[str, Any]:
        """The v2 response: each output asked for (default: logits and probabilities of a classifier, the
        features of a feature extractor) as FP32 [N, ...], data flat in row-major order."""
        names = list(names) or (["logits", "probabilities"] if self.has_classifier else ["features"])
        logits = torch.from_numpy(np.stack([np.asarray(r.output["logits"], np.float32) for r in done]))
        if self.has_classifier and not torch.isfinite(logits).all():
            raise Fault(500, "not_finite", "the model's output is not finite (NaN or Inf): its weights hold "
                        "non-finite values or overflow")
        values = {"logits": logits, "probabilities": logits.softmax(dim=-1),
                  "features": torch.from_numpy(np.stack([np.asarray(r.output["features"], np.float32) for r in done]))}
        out = {"model_name": self.model_id, "outputs": [
            {"name": n, "datatype": "FP32", "shape": list(values[n].shape), "data": values[n].reshape(-1).tolist()}
            for n in names],
            "parameters": {"engine": self.engine.name, "dtype": self.engine.dtype,
                           "batches": sorted({r.batch.id for r in done})}}
        if request_id is not None:
            out["id"] = request_id
        return out

    def model_info(self) -> Dict[str, Any]:
        from .. import __version__

        cfg = self.config
        return {"id": self.model_id, "title": f"{self.model_id} · {architecture(cfg)}", "name": cfg.name,
                "format": self.meta.format, "source": self.meta.source,
                "notes": list(self.meta.notes), "num_classes": cfg.num_classes,
                "has_classifier": self.has_classifier, "labels": self.labels,
                "input": {"height": cfg.img_size[0], "width": cfg.img_size[1], "channels": cfg.in_chans},
                "preprocessing": self.pre.to_dict(), "preprocessing_summary": self.pre.describe(),
                "config": cfg.to_dict(),
                "engine": self.engine.info() if self.engine is not None else None,
                "dtype": self.options.dtype, "engine_selection": self.engine_report,
                "kernels": self.kernels, "ready": self.ready,
                "options": self.options.public(), "vitkit": __version__}
