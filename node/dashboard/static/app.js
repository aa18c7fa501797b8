// The hivenet dashboard: draws each panel from its JSON API and redraws on server-sent events.
// Everything is built with DOM calls and textContent (names come from the network).
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function $(id) { return document.getElementById(id); }

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json();
  if (!response.ok) { throw new Error(body.error || response.statusText); }
  return body;
}

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) { node.textContent = String(text); }
  for (const [key, value] of Object.entries(attrs || {})) { node.setAttribute(key, value); }
  return node;
}

function link(text, href, cls) {
  return el("a", text, cls ? { href: href, class: cls } : { href: href });
}

function fillRows(table, rows) {
  const body = $(table).querySelector("tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) { td.appendChild(cell); } else { td.textContent = cell === null || cell === undefined ? "" : String(cell); }
      if (typeof cell === "number") { td.className = "num"; }
      tr.appendChild(td);
    }
    return tr;
  }));
}

function fmt(value, digits) {
  return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 1 : digits });
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) { return ""; }
  if (seconds < 90) { return fmt(seconds, 0) + " s"; }
  if (seconds < 5400) { return fmt(seconds / 60, 0) + " min"; }
  if (seconds < 172800) { return fmt(seconds / 3600, 1) + " h"; }
  return fmt(seconds / 86400, 1) + " d";
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return fmt(n, 1) + " " + units[i];
}

const REACHABILITY = { public: "public", private: "behind NAT", unknown: "unchecked" };

function when(unix) { return new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19); }

function shortPeer(peer) { return peer.slice(0, 6) + "…" + peer.slice(-8); }

function peerLink(peer) {
  const a = link(shortPeer(peer), "/node/" + encodeURIComponent(peer), "peer");
  a.title = peer;
  return a;
}

const PLOT = { width: 600, height: 160, pad: 28 };

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) { node.setAttribute(key, value); }
  if (text !== undefined) { node.textContent = text; }
  return node;
}

function plotFrame() {
  return svgNode("svg", { viewBox: `0 0 ${PLOT.width} ${PLOT.height}`, role: "img" });
}

function captions(svg, labels) {
  for (const [x, y, text, color] of labels) {
    svg.appendChild(svgNode("text", { x: x, y: y, "font-size": "11", fill: color }, text));
  }
}

// The y of `value` on a scale from `low` to `high` inside the plot's padding.
function scaleY(value, low, high) {
  const span = Math.max(1e-9, high - low);
  return PLOT.height - PLOT.pad - ((value - low) / span) * (PLOT.height - 2 * PLOT.pad);
}

// Axes and three horizontal gridlines (low, middle, high of the y scale), each labelled at the left.
function grid(svg, low, high, digits) {
  const { width, height, pad } = PLOT;
  for (const value of [low, (low + high) / 2, high]) {
    const y = scaleY(value, low, high);
    svg.appendChild(svgNode("line", { x1: pad, x2: width - pad, y1: y, y2: y, stroke: "#d0d5dd", "stroke-width": "1", class: "grid" }));
    svg.appendChild(svgNode("text", { x: 2, y: y + 4, "font-size": "9", fill: "#5b6475", class: "tick" }, fmt(value, digits)));
  }
  svg.appendChild(svgNode("line", { x1: pad, x2: pad, y1: pad, y2: height - pad, stroke: "#5b6475", class: "axis" }));
  svg.appendChild(svgNode("line", { x1: pad, x2: width - pad, y1: height - pad, y2: height - pad, stroke: "#5b6475", class: "axis" }));
}

// A bar plot of `bars` with an optional line of `line` on its own scale, under `edges` in time.
function plot(container, edges, bars, barLabel, line, lineLabel) {
  const { width, height, pad } = PLOT;
  const svg = plotFrame();
  const maxBar = Math.max(1e-9, ...bars);
  grid(svg, 0, maxBar, 0);
  const step = (width - 2 * pad) / Math.max(1, bars.length);
  bars.forEach((value, i) => {
    const h = (value / maxBar) * (height - 2 * pad);
    const rect = svgNode("rect", { x: pad + i * step + 1, y: height - pad - h, width: Math.max(1, step - 2), height: h, fill: "#3b6fd4" });
    rect.appendChild(svgNode("title", {}, `${barLabel} ${fmt(value)} until ${when(edges[i + 1])}`));
    svg.appendChild(rect);
  });
  if (line) {
    const maxLine = Math.max(1e-9, ...line);
    const points = line.map((value, i) => `${pad + (i + 0.5) * step},${scaleY(value, 0, maxLine)}`);
    svg.appendChild(svgNode("polyline", { points: points.join(" "), fill: "none", stroke: "#b42318", "stroke-width": "2" }));
  }
  const labels = [[pad, 14, `${barLabel} (max ${fmt(maxBar)})`, "#3b6fd4"]];
  if (line) { labels.push([width / 2, 14, `${lineLabel} (max ${fmt(Math.max(0, ...line), 0)})`, "#b42318"]); }
  labels.push([pad, height - 8, when(edges[0]), "#5b6475"], [width - pad - 130, height - 8, when(edges[edges.length - 1]), "#5b6475"]);
  captions(svg, labels);
  container.replaceChildren(svg);
}

// A curve of `points` ({x, y, href, title}) against x (an outer step, a policy version); each
// point links to the receipts behind it.
function curve(container, points, label, xLabel) {
  const { width, height, pad } = PLOT;
  if (!points.length) {
    container.replaceChildren(el("p", `no ${label} in the receipts yet`, { class: "note" }));
    return;
  }
  const svg = plotFrame();
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  const [lowX, highX] = [Math.min(...xs), Math.max(...xs)];
  const [lowY, highY] = [Math.min(...ys), Math.max(...ys)];
  const bottom = lowY === highY ? lowY - 1 : lowY, top = lowY === highY ? highY + 1 : highY;
  const at = (p) => [highX === lowX ? width / 2 : pad + ((p.x - lowX) / (highX - lowX)) * (width - 2 * pad), scaleY(p.y, bottom, top)];
  grid(svg, bottom, top, 3);
  svg.appendChild(svgNode("polyline", { points: points.map((p) => at(p).join(",")).join(" "), fill: "none", stroke: "#3b6fd4", "stroke-width": "2" }));
  for (const p of points) {
    const [x, y] = at(p);
    const a = svgNode("a", { href: p.href });
    const dot = svgNode("circle", { cx: x, cy: y, r: 4, fill: "#3b6fd4" });
    dot.appendChild(svgNode("title", {}, p.title));
    a.appendChild(dot);
    svg.appendChild(a);
  }
  captions(svg, [
    [pad, 14, `${label} (${fmt(lowY, 3)} to ${fmt(highY, 3)})`, "#3b6fd4"],
    [pad, height - 8, `${xLabel} ${lowX}`, "#5b6475"],
    [width - pad - 90, height - 8, `${xLabel} ${highX}`, "#5b6475"],
  ]);
  container.replaceChildren(svg);
}

async function drawSwarm() {
  const swarm = await api("/api/swarm");
  $("run").textContent = "run " + swarm.run_id;
  $("node-count").textContent = swarm.nodes;
  $("by-role").replaceChildren(...Object.entries(swarm.by_role).map(([role, n]) => el("span", `${role} ${n}`, { class: "role", "data-role": role })));
  fillRows("swarm-table", swarm.list.map((n) => [n.label, peerLink(n.peer_id), n.roles.join(", "), duration(n.online_s), duration(n.last_seen_s) + " ago", n.credit_recent === null ? "" : fmt(n.credit_recent, 0), n.tokens_per_min === null ? "" : fmt(n.tokens_per_min, 1), n.policy_version === null ? "" : "v" + n.policy_version, REACHABILITY[n.reachability] || n.reachability, n.software_version]));
  $("swarm-note").textContent = swarm.connected ? "" : "not connected to a swarm (no --initial-peers): showing the ledger only";
}

async function drawLeaderboard() {
  const board = await api("/api/leaderboard?limit=100");
  const points = Object.entries(board.points).map(([role, what]) => `${role} ${what}`).join(", ");
  $("leaderboard-note").textContent = `${board.contributors} contributors, ${board.receipts} receipts. Credit is in points: ${points}; recent average per day, with a half-life of ${duration(board.half_life_s)}`;
  fillRows("leaderboard", board.rows.map((r) => [
    r.rank, r.name, peerLink(r.peer_id),
    fmt(r.roles.inference), fmt(r.roles.trainer), fmt(r.roles.broadcast), fmt(r.roles.seed), fmt(r.roles.validator),
    fmt(r.total), fmt(r.recent), r.untrusted ? fmt(r.untrusted) : "", link(r.receipts, r.receipts_url),
  ]));
}

function reasonLinks(reasons) {
  const span = el("span");
  reasons.forEach((r, i) => {
    if (i) { span.appendChild(document.createTextNode(", ")); }
    span.appendChild(link(`${r.reason} ${r.count}`, r.receipts_url));
  });
  return span;
}

async function drawVerification() {
  const v = await api("/api/verification");
  $("accepted").textContent = v.accepted;
  $("rejected").textContent = v.rejected;
  $("validators").textContent = v.validators;
  $("accepted-link").href = v.receipts_url;
  $("rejected-link").href = v.rejected_receipts_url;
  fillRows("reasons", v.by_reason.map((r) => [el("span", r.reason, { class: "rejected" }), link(r.count, r.receipts_url)]));
  fillRows("rejected-peers", v.rejected_peers.map((p) => [p.name, peerLink(p.peer_id), p.rejected, Object.entries(p.reasons).map(([k, n]) => `${k} ${n}`).join(", ")]));
  const banState = (b) => (b.active ? el("span", "until " + new Date(b.banned_until * 1000).toLocaleTimeString(), { class: "rejected" }) : "over");
  fillRows("banned", v.banned.map((b) => [b.name, peerLink(b.peer_id), b.bans, banState(b), reasonLinks(b.reasons), b.validators]));
  plot($("history-plot"), v.history.edges, v.history.credit, "credit counted", v.history.rejections, "rollouts rejected");
}

// The weights page shown: the API's own older/newer links, so a live redraw keeps the same versions.
let weightsUrl = "/api/weights";

async function drawWeights() {
  const url = weightsUrl;
  const w = await api(url);
  if (url !== weightsUrl) { return; }  // a click moved to another page while this one loaded
  fillRows("weights", w.versions.map((v) => [v.version, link(v.receipts, v.receipts_url), bytes(v.bytes), v.sources, v.fetchers, duration(v.spread_s)]));
  const paged = w.older_url !== null || w.newer_url !== null;
  $("weights-note").textContent = paged && w.versions.length ? `versions ${w.offset + 1} to ${w.offset + w.versions.length} of ${w.total}, newest first` : "";
  $("weights-pager").hidden = !paged;
  for (const [id, target] of [["weights-older", w.older_url], ["weights-newer", w.newer_url]]) {
    const button = $(id);
    button.disabled = target === null;
    button.onclick = target === null ? null : () => { weightsUrl = target; drawWeights().catch(showError); };
  }
}

async function drawCredit() {
  const c = await api("/api/credit");
  $("standing").replaceChildren(...Object.entries(c.standing).map(([name, s]) => link(`${s.count} ${name}`, s.receipts_url, "figure")));
  $("kinds").replaceChildren(...Object.entries(c.kinds).map(([name, k]) => link(`${k.count} ${name}`, k.receipts_url, "figure")));
  $("trusted-note").textContent = `${c.trusted.length} trusted signer(s), ${c.vouchers.length} vouching signer(s) one hop away, ${c.signers} signers in all.` +
    (c.trusted.length ? "" : " No trusted signer was given (--trusted): every receipt counts zero.");
}

async function drawTraining() {
  const t = await api("/api/training");
  $("outer-steps").textContent = fmt(t.outer_steps, 0);
  $("tokens-trained").textContent = fmt(t.tokens_trained, 0);
  $("bytes-exchanged").textContent = bytes(t.bytes_exchanged);
  $("bytes-per-token").textContent = t.bytes_per_token === null ? "-" : fmt(t.bytes_per_token, 2);
  for (const id of ["outer-steps-link", "tokens-link", "bytes-link", "per-token-link"]) { $(id).href = t.receipts_url; }
  curve($("loss-plot"), t.loss.map((p) => ({
    x: p.step, y: p.loss, href: p.receipts_url, title: `outer step ${p.step}: loss ${fmt(p.loss, 4)}, median of ${p.signers} signer(s)`,
  })), "loss", "outer step");
  curve($("reward-plot"), t.reward.map((p) => ({
    x: p.version, y: p.reward, href: p.receipts_url, title: `policy version ${p.version}: mean reward ${fmt(p.reward, 3)} over ${p.rollouts} accepted rollout(s)`,
  })), "mean reward", "version");
  // An RL run without DiLoCo rounds signs no training receipts: its figures replace the outer steps'.
  const rl = t.reward.length > 0;
  const diloco = t.outer_steps > 0 || !rl;
  $("diloco-figures").hidden = !diloco;
  $("loss-block").hidden = !diloco;
  $("rl-figures").hidden = !rl;
  $("reward-block").hidden = !rl;
  $("latest-version").textContent = t.latest_version === null ? "-" : "v" + t.latest_version;
  $("rollouts-accepted").textContent = fmt(t.rollouts_accepted, 0);
  $("latest-reward").textContent = t.latest_reward === null ? "-" : fmt(t.latest_reward, 3);
  $("rollouts-link").href = t.rewards_url;
  if (t.latest_version_url) { $("version-link").href = t.latest_version_url; }
  $("training-note").textContent = t.left_out ? `${t.left_out} receipt(s) from signers the run neither trusts nor vouches for are left out.` : "";
}

async function drawOverview() {
  await Promise.all([drawSwarm(), drawLeaderboard(), drawVerification(), drawTraining(), drawWeights(), drawCredit()]);
}

function amount(r) {
  if (r.kind === "rollout") { return `${r.tokens} tokens` + (r.accepted ? "" : ` (rejected: ${r.reason})`); }
  if (r.kind === "training") { return `${r.tokens} tokens, step ${r.step}`; }
  if (r.kind === "transfer") { return `${bytes(r.bytes)} of v${r.step}`; }
  if (r.kind === "validation") { return `${r.count} rollouts, ${r.tokens} tokens validated`; }
  return `${r.count} service(s)`;
}

async function drawNode(peer) {
  let n;
  try {
    n = await api("/api/node/" + encodeURIComponent(peer));
  } catch (error) {
    $("node-page").hidden = true;
    $("missing").hidden = false;
    $("missing-text").textContent = `${peer}: ${error.message}`;
    return;
  }
  $("missing").hidden = true;
  $("node-page").hidden = false;
  $("run").textContent = "run " + n.run_id;
  $("node-name").textContent = n.name || shortPeer(n.peer_id);
  $("node-peer").textContent = n.peer_id;
  $("node-total").textContent = fmt(n.credit.total);
  $("node-recent").textContent = fmt(n.credit.recent);
  $("node-receipts").textContent = n.receipts;
  $("node-receipts-link").href = n.receipts_url;
  $("node-rejected").textContent = n.rejections.count;
  $("node-status").textContent = n.live ? `live as ${n.roles.join(", ")} for ${duration(n.online_s)}` : "not live now";
  fillRows("node-roles", Object.entries(n.credit.roles).map(([role, c]) => [role, fmt(c.total), fmt(c.recent), c.untrusted ? fmt(c.untrusted) : "", c.receipts]));
  plot($("node-plot"), n.history.edges, n.history.cumulative_credit, "credit (cumulative)");
  fillRows("node-reasons", n.rejections.by_reason.map((r) => [el("span", r.reason, { class: "rejected" }), link(r.count, r.receipts_url)]));
  fillRows("node-rejections", n.rejections.latest.map((r) => [when(r.issued_at), r.reason, r.detail || "", peerLink(r.signer), link(r.id.slice(0, 12), r.url)]));
  fillRows("node-latest", n.latest.map((r) => [when(r.issued_at), r.kind, peerLink(r.signer), amount(r), r.standing, fmt(r.counted), link(r.id.slice(0, 12), r.url)]));
}

function listen(redraw) {
  const badge = $("live");
  const events = new EventSource("/api/events");
  let last = null;
  events.addEventListener("update", (event) => {
    badge.textContent = "live";
    badge.className = "badge on";
    if (last !== null && event.data !== last) { redraw().catch(showError); }
    last = event.data;
  });
  events.onerror = () => { badge.textContent = "reconnecting"; badge.className = "badge"; };
}

function showError(error) { $("live").textContent = "error: " + error.message; }

function main() {
  const match = window.location.pathname.match(/^\/node\/([^/]+)$/);
  let redraw;
  if (match) {
    const peer = decodeURIComponent(match[1]);
    redraw = () => drawNode(peer);
  } else {
    $("overview").hidden = false;
    redraw = drawOverview;
  }
  redraw().then(() => { document.body.dataset.ready = "1"; }).catch(showError);
  listen(async () => { await redraw(); document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1); });
}

document.addEventListener("DOMContentLoaded", main);
