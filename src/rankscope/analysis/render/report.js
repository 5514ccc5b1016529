(() => {
  "use strict";
  const data = JSON.parse(document.getElementById("rankscope-data").textContent);
  const hm = data.heatmap;
  if (!hm) return;
  const canvas = document.getElementById("heatmap-canvas");
  const select = document.getElementById("metric");
  const tip = document.getElementById("tip");
  const legend = document.getElementById("legend");
  const scale = document.getElementById("scale");
  const GUTTER = 76, TOP = 20, MISSING = [217, 217, 217];
  // viridis at ten even stops: dark (fast) to yellow (slow)
  const STOPS = [[68,1,84],[72,40,120],[62,73,137],[49,104,142],[38,130,142],
                 [31,158,137],[53,183,121],[110,206,88],[181,222,43],[253,231,37]];
  const LUT = new Uint8ClampedArray(256 * 3);
  for (let k = 0; k < 256; k++) {
    const t = k / 255 * (STOPS.length - 1), i = Math.min(Math.floor(t), STOPS.length - 2), f = t - i;
    for (let c = 0; c < 3; c++) LUT[3 * k + c] = STOPS[i][c] + (STOPS[i + 1][c] - STOPS[i][c]) * f;
  }
  const marks = new Map(hm.marks);
  const nr = hm.labels.length, ns = hm.steps.length;
  let geo = null;

  function fmt(v, unit) {
    if (v === null || v === undefined) return "no record";
    const a = Math.abs(v);
    const s = a >= 1e4 ? Math.round(v).toLocaleString("en-US") : String(Number(v.toPrecision(4)));
    return unit ? s + " " + unit : s;
  }

  function nice(n, steps) {
    for (const s of steps) if (s >= n) return s;
    return steps[steps.length - 1];
  }

  function draw() {
    const t0 = performance.now();
    const m = hm.metrics[Number(select.value) || 0];
    const avail = Math.max(ns, canvas.parentElement.clientWidth - GUTTER - 4);
    const cw = Math.max(1, Math.min(40, Math.floor(avail / ns)));
    const ch = Math.max(1, Math.min(22, Math.floor(640 / nr)));
    canvas.width = GUTTER + ns * cw;
    canvas.height = TOP + nr * ch;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    const img = new ImageData(ns, nr), px = img.data, vals = m.values;
    const lo = m.lo, span = m.hi - m.lo;
    let drawn = 0;
    for (let i = 0; i < nr * ns; i++) {
      const v = vals[i], o = 4 * i;
      if (v === null) {
        px[o] = MISSING[0]; px[o + 1] = MISSING[1]; px[o + 2] = MISSING[2];
      } else {
        let k = span > 0 ? Math.round((v - lo) / span * 255) : 128;
        k = 3 * (k < 0 ? 0 : k > 255 ? 255 : k);
        px[o] = LUT[k]; px[o + 1] = LUT[k + 1]; px[o + 2] = LUT[k + 2];
        drawn++;
      }
      px[o + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = ns;
    off.height = nr;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, GUTTER, TOP, ns * cw, nr * ch);

    ctx.fillStyle = "#5f6b7a";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    const every = nice(Math.ceil(13 / ch), [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 65536]);
    const markY = hm.marks.map(([row]) => TOP + row * ch + ch / 2);
    for (let r = 0; r < nr; r += every) {
      const y = TOP + r * ch + ch / 2;
      // a straggler's own label goes there instead
      if (!markY.some((m) => Math.abs(m - y) < 12)) ctx.fillText(hm.labels[r], GUTTER - 12, y);
    }
    ctx.textAlign = "left";
    ctx.fillText("rank", 2, TOP / 2);
    ctx.textAlign = "center";
    const sEvery = nice(Math.ceil(36 / cw), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000, 100000]);
    for (let s = 0; s < ns; s += sEvery) ctx.fillText(String(hm.steps[s]), GUTTER + s * cw + cw / 2, TOP / 2);
    ctx.fillStyle = "#e0301e";
    ctx.textAlign = "right";
    ctx.font = "bold 11px system-ui, sans-serif";
    for (const [row] of hm.marks) {
      const h = Math.max(ch, 5), y = TOP + row * ch + ch / 2;
      ctx.fillRect(GUTTER - 9, y - h / 2, 7, h);
      ctx.fillText(hm.labels[row], GUTTER - 12, y);
    }
    geo = { cw, ch, m };
    canvas.dataset.cells = String(nr * ns);
    canvas.dataset.values = String(drawn);
    canvas.dataset.metric = m.name;
    canvas.dataset.rows = String(nr);
    canvas.dataset.gutter = String(GUTTER);
    canvas.dataset.top = String(TOP);
    canvas.dataset.cw = String(cw);
    canvas.dataset.ch = String(ch);
    canvas.dataset.drawMs = (performance.now() - t0).toFixed(1);
    showLegend(m);
  }

  function showLegend(m) {
    const stops = [];
    for (let k = 0; k <= 10; k++) {
      const i = 3 * Math.round(k * 25.5);
      stops.push("rgb(" + LUT[i] + "," + LUT[i + 1] + "," + LUT[i + 2] + ") " + k * 10 + "%");
    }
    legend.querySelector(".bar").style.background = "linear-gradient(to right," + stops.join(",") + ")";
    legend.querySelector(".missing-key").style.background = "rgb(" + MISSING.join(",") + ")";
    if (m.lo === undefined) {
      legend.querySelector(".lo").textContent = "fast";
      legend.querySelector(".hi").textContent = "slow";
      scale.textContent = "This metric has no values.";
      return;
    }
    const clipped = m.min < m.lo || m.max > m.hi;
    legend.querySelector(".lo").textContent = "fast " + (m.min < m.lo ? "≤ " : "") + fmt(m.lo, m.unit);
    legend.querySelector(".hi").textContent = (m.max > m.hi ? "≥ " : "") + fmt(m.hi, m.unit) + " slow";
    scale.textContent = clipped
      ? "Colours span the " + hm.clip[0] + "th to " + hm.clip[1] + "th percentile (" + fmt(m.lo, m.unit) + " to " + fmt(m.hi, m.unit) +
        "); values beyond take the end colours. Smallest " + fmt(m.min, m.unit) +
        ", largest " + fmt(m.max, m.unit) + "."
      : "Colours span the smallest to the largest value.";
  }

  function hideTip() { tip.hidden = true; }

  canvas.addEventListener("mousemove", (e) => {
    if (!geo) return;
    const box = canvas.getBoundingClientRect();
    const x = (e.clientX - box.left) * canvas.width / box.width - GUTTER;
    const y = (e.clientY - box.top) * canvas.height / box.height - TOP;
    const row = Math.floor(y / geo.ch), col = Math.floor(x / geo.cw);
    if (row < 0 || row >= nr || col >= ns) return hideTip();
    const host = hm.hosts[row];
    const lines = [hm.rows[row] > 1
      ? "ranks " + hm.labels[row] + " (the slowest of these " + hm.rows[row] + ")"
      : "rank " + hm.labels[row] + (host ? " on " + host : "")];
    if (col >= 0) {
      const last = col + 1 < ns ? hm.steps[col + 1] - 1 : null;
      lines.push(hm.per > 1
        ? "steps " + hm.steps[col] + (last === null ? " on" : "-" + last) + " (mean)"
        : "step " + hm.steps[col]);
      lines.push(geo.m.label + ": " + fmt(geo.m.values[row * ns + col], geo.m.unit));
    }
    if (marks.has(row)) lines.push("straggler: " + marks.get(row));
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    const left = e.clientX + 14 + tip.offsetWidth > window.innerWidth ? e.clientX - 14 - tip.offsetWidth : e.clientX + 14;
    tip.style.left = left + "px";
    tip.style.top = (e.clientY + 14) + "px";
  });
  canvas.addEventListener("mouseleave", hideTip);
  select.addEventListener("change", draw);
  let pending = false;
  window.addEventListener("resize", () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  });
  draw();
})();
