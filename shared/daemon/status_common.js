// What both daemons' status pages share (spliced into each page when it is
// compiled in: the page stays one self-contained file). Prometheus text
// parsed into series, summed by labels; table cells with data-* attributes
// for the tests; rates from two readings of the counters.
"use strict";
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line[0] === "#") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}
function sum(metrics, name, match) {
  let total = 0;
  for (const m of metrics) {
    if (m.name !== name) continue;
    if (Object.entries(match).every(([k, v]) => m.labels[k] === v)) total += m.value;
  }
  return total;
}
function cell(row, text, attrs, numeric) {
  const td = row.insertCell();
  td.textContent = text;
  if (numeric) td.className = "n";
  for (const [k, v] of Object.entries(attrs || {})) td.dataset[k] = v;
  return td;
}
// The per-second rate of the series `name` (matching `match`) between the
// readings `last` ({at, metrics}, or null) and the current one.
function rateOf(last, at, metrics, name, match) {
  if (!last) return "…";
  const seconds = (at - last.at) / 1000;
  return seconds > 0 ? ((sum(metrics, name, match) - sum(last.metrics, name, match)) / seconds).toFixed(1) : "…";
}
