// The page of vitkit serve: choose or drop images, each is sent to /v1/explain (top-5 and the rollout overlay).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  let token = sessionStorage.getItem("vitkit-token") || "";
  let model = null;

  function headers() { return token ? { Authorization: "Bearer " + token } : {}; }

  function say(text, isError) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("error", !!isError);
  }

  async function loadModel() {
    let r;
    try { r = await fetch("v1/model", { headers: headers() }); }
    catch (e) { $("model").textContent = "The server cannot be reached."; return; }
    if (r.status === 401) { $("token-box").hidden = false; $("model").textContent = "A token is needed."; $("token").focus(); return; }
    const body = await r.json();
    if (!r.ok) { $("model").textContent = body.detail || ("HTTP " + r.status); setTimeout(loadModel, 1000); return; }
    model = body;
    $("token-box").hidden = true;
    document.title = model.title + " · vitkit serve";
    if (!model.ready) { $("model").textContent = model.title + ": warming up…"; setTimeout(loadModel, 500); return; }
    const e = model.engine || {};
    $("model").textContent = model.title + " · " + model.num_classes + " classes · engine " + e.name + " (" +
      e.dtype + ")";
  }

  function percent(p) { return (100 * p).toFixed(p >= 0.1 ? 1 : 2) + "%"; }

  function card(file) {
    const node = $("card").content.firstElementChild.cloneNode(true);
    node.querySelector(".name").textContent = file.name;
    const img = node.querySelector(".original");
    img.src = URL.createObjectURL(file);
    img.alt = "the image " + file.name;
    node.querySelector(".timing").textContent = "classifying…";
    $("results").prepend(node);
    return node;
  }

  function show(node, row, timing, engine) {
    const ol = node.querySelector(".top");
    ol.textContent = "";
    for (const t of row.top || []) {
      const li = document.createElement("li");
      li.className = "row";
      const label = document.createElement("span"); label.className = "label"; label.textContent = t.label; label.title = t.label;
      const track = document.createElement("span"); track.className = "track";
      track.setAttribute("role", "meter"); track.setAttribute("aria-valuemin", "0"); track.setAttribute("aria-valuemax", "100");
      track.setAttribute("aria-valuenow", (100 * t.prob).toFixed(1)); track.setAttribute("aria-label", t.label);
      const fill = document.createElement("span"); fill.className = "fill"; fill.style.width = (100 * t.prob).toFixed(2) + "%"; fill.style.display = "block";
      track.appendChild(fill);
      const prob = document.createElement("span"); prob.className = "prob"; prob.textContent = percent(t.prob);
      li.append(label, track, prob);
      ol.appendChild(li);
    }
    if (!row.top) { const li = document.createElement("li"); li.textContent = "(no classifier: rollout only)"; ol.appendChild(li); }
    const ov = node.querySelector(".overlay");
    ov.src = "data:image/png;base64," + row.overlay_png;
    ov.alt = "attention rollout over the model's input crop" + (row.top ? " (top class: " + row.top[0].label + ")" : "");
    node.querySelector(".timing").textContent = "engine " + engine + " · " + row.geometry + " · total " +
      timing.total.toFixed(1) + " ms (queue " + timing.queue.toFixed(1) + ", compute " + timing.compute.toFixed(1) +
      " ms, batch of " + row.batch.size + ")";
  }

  async function send(file) {
    const node = card(file);
    const form = new FormData();
    form.append("file", file, file.name);
    try {
      const r = await fetch("v1/explain?topk=5", { method: "POST", body: form, headers: headers() });
      const body = await r.json();
      if (!r.ok) { node.querySelector(".timing").textContent = body.detail || ("HTTP " + r.status); node.querySelector(".timing").classList.add("error"); return false; }
      show(node, body.results[0], body.timing_ms, body.engine);
      return true;
    } catch (e) {
      node.querySelector(".timing").textContent = "the request failed: " + e; node.querySelector(".timing").classList.add("error");
      return false;
    }
  }

  async function handle(files) {
    files = Array.from(files || []);
    if (!files.length) return;
    say("Classifying " + files.length + " image" + (files.length > 1 ? "s" : "") + "…");
    const ok = await Promise.all(files.map(send));
    const good = ok.filter(Boolean).length;
    say(good + " of " + files.length + " classified.", good < files.length);
  }

  const drop = $("drop");
  drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); $("files").click(); } });
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); handle(e.dataTransfer.files); });
  $("files").addEventListener("change", (e) => { handle(e.target.files); e.target.value = ""; });
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault(); token = $("token").value.trim(); sessionStorage.setItem("vitkit-token", token); loadModel();
  });
  loadModel();
})();
