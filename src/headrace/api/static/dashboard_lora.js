// Headrace dashboard, the LoRA panel: a row per base model and per adapter, from the
// snapshot's `lora` (dashboard_lora.py). Token rates are taken as the other panels take
// theirs, against the snapshot RATE_POLLS polls ago; `row`, `fmt` and `rate` are dashboard.js's.
"use strict";

function drawLora(snap, before, dt) {
  const rows = [];
  for (const [model, entries] of Object.entries(snap.lora ?? {})) {
    const old = {};
    for (const r of before?.lora?.[model] ?? []) old[r.name] = r;
    for (const r of entries) rows.push(loraRow(model, r, old[r.name], dt));
  }
  if (rows.length === 0) rows.push(row(["(no LoRA adapter served)"]));
  document.querySelector("#loras tbody").replaceChildren(...rows);
}

function loraRow(model, r, old, dt) {
  const perSecond = (key) => fmt(rate(r[key], old?.[key], dt), 1);
  const memory = !r.adapter ? "base" : r.resident > 0 ? "resident" : "on disk";
  return row([model, r.adapter ? r.name : r.name + " (base)", r.running, r.waiting,
    fmt(r.prompt_tokens), perSecond("prompt_tokens"), fmt(r.generation_tokens),
    perSecond("generation_tokens"), memory, r.adapter ? r.loads : "–",
    r.adapter ? r.evictions : "–"], [null, null, null, null, null, null, null, null,
    "memory-" + memory.replace(" ", "-")]);
}
