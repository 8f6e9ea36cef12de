// The cache view: polls GET /v1/cache and draws the KV pool over time, the requests running and
// waiting, the hit ratio, and the longest cached prefixes.
import { ApiError, getJSON } from "./api.js";

const PERIOD_MS = 1000;
const SAMPLES = 120;   // two minutes of history

const $ = (id) => document.getElementById(id);

export class CacheView {
  constructor() {
    this.samples = [];   // {used, cached} pages, one per poll
    this.timer = null;
  }

  start() {
    if (!this.timer) this.timer = setTimeout(() => this.poll(), 0);
  }

  // The next poll is set once this one has its answer: a slow answer (the engine busy with a long
  // step) delays the view rather than piling requests up.
  async poll() {
    let view = null;
    try {
      view = await getJSON(`/v1/cache?limit=8&order=${$("prefix-order").value}`);
      $("cache-status").textContent = "";
    } catch (e) {
      $("cache-status").textContent = e instanceof ApiError ? e.message : "server unreachable";
      if (e instanceof ApiError && e.status === 401) { this.timer = null; return; }   // started again with a key
    }
    if (view) this.show(view);
    this.timer = setTimeout(() => this.poll(), PERIOD_MS);
  }

  show(view) {
    const p = view.kv_pages;
    this.samples.push({ used: p.used, cached: p.cached });
    if (this.samples.length > SAMPLES) this.samples.shift();
    $("kv-used").textContent = p.used;
    $("kv-cached").textContent = p.cached;
    $("kv-free").textContent = p.free;
    $("kv-usage").textContent = `${(100 * p.usage).toFixed(1)}%`;
    $("running").textContent = view.requests.running;
    $("waiting").textContent = view.requests.waiting;
    const c = view.prefix_cache;
    $("hit-ratio").textContent = c.queried_tokens ? `${(100 * c.hit_ratio).toFixed(1)}%` : "–";
    $("hit-tokens").textContent = `${c.hit_tokens} of ${c.queried_tokens} prompt tokens`;
    this.disk(view);
    this.table(view);
    this.draw();
  }

  disk(view) {   // the tier under the tree, when the server runs with --cache-dir
    const d = view.disk;
    $("disk-head").hidden = $("disk").hidden = !d;
    if (!d) return;
    $("disk-pages").textContent = d.pages;
    $("disk-size").textContent = megabytes(d.bytes);
    $("disk-max").textContent = megabytes(d.max_bytes);
    $("disk-hits").textContent = view.prefix_cache.disk_hit_tokens;
  }

  table(view) {
    const body = $("prefixes").tBodies[0];
    body.replaceChildren(...view.prefixes.map((p) => {
      const row = document.createElement("tr");
      const cells = [p.tokens, p.hits, p.in_use ? "yes" : ""];
      if (view.prefix_text) cells.push(p.text ?? "");
      for (const value of cells) {
        const td = document.createElement("td");
        td.textContent = value;
        row.append(td);
      }
      return row;
    }));
    $("prefix-text-head").hidden = !view.prefix_text;
    $("no-prefixes").hidden = view.prefixes.length > 0;
  }

  // Pages over time, stacked: held by requests (bottom), owned by the tree (top). The scale follows
  // the largest sample shown: a pool sized for long prompts would hide a chat's pages at full scale.
  draw() {
    const canvas = $("kv-chart");
    const scale = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== w * scale) { canvas.width = w * scale; canvas.height = h * scale; }
    const g = canvas.getContext("2d");
    g.setTransform(scale, 0, 0, scale, 0, 0);
    g.clearRect(0, 0, w, h);
    g.strokeStyle = "#ccc";
    g.strokeRect(0.5, 0.5, w - 1, h - 1);
    const ceiling = Math.max(16, ...this.samples.map((s) => 1.25 * (s.used + s.cached)));
    const x = (i) => w - (this.samples.length - 1 - i) * (w / (SAMPLES - 1));
    const y = (pages) => h - (pages / ceiling) * (h - 2) - 1;
    const area = (top, bottom, color) => {
      g.beginPath();
      this.samples.forEach((s, i) => g.lineTo(x(i), y(top(s))));
      for (let i = this.samples.length - 1; i >= 0; i--) g.lineTo(x(i), y(bottom(this.samples[i])));
      g.closePath();
      g.fillStyle = color;
      g.fill();
    };
    area((s) => s.used + s.cached, (s) => s.used, "#8ab4f8");
    area((s) => s.used, () => 0, "#f6ae2d");
    g.fillStyle = "#777";
    g.font = "11px system-ui, sans-serif";
    g.fillText(`${Math.round(ceiling)} pages`, 4, 12);
    canvas.dataset.samples = this.samples.length;
  }
}

function megabytes(bytes) {
  return bytes >= 1e9 ? `${(bytes / 1e9).toFixed(1)} GB` : `${(bytes / 1e6).toFixed(1)} MB`;
}
