// ControlZ page script: reads /debug/controlz every few seconds and renders it; changes a log
// scope's level with PUT /debug/scopes/SCOPE. Every value from the server is set as text (never
// parsed as HTML): proxy ids, NACK messages and config names come from outside.
"use strict";

const REFRESH_MS = 3000;
const STAGES = [  // push stages in the order they happen, as /debug/push_timeline names them
  ["debounce", "#9aa5b8", "debounce"],
  ["context_build", "#4c78a8", "push context build"],
  ["generate", "#f58518", "generate (sum over types)"],
  ["queue_max", "#b279a2", "longest proxy queue wait"],
  ["send", "#54a24b", "send (sum over proxies)"],
];
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function table(headers, rows, id) {
  return el("table", {id},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => (c instanceof Element && c.tagName === "TD" ? c : el("td", {}, c)))))));
}

function empty(text) { return el("p", {class: "empty"}, text); }

function fill(id, ...nodes) {
  const target = document.getElementById(id);
  target.replaceChildren(...nodes);
}

function stateBadge(state) {
  const cls = state.startsWith("STALE") ? "STALE" : state.replace(" ", "");
  return el("span", {class: "state " + cls, title: state}, state);
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function ms(v) { return v === undefined || v === null ? "-" : (v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " ms"; }

function renderProxies(proxies) {
  document.getElementById("proxy-count").textContent = "(" + proxies.length + ")";
  if (!proxies.length) return fill("proxies", empty("No proxy is connected."));
  const types = [...new Set(proxies.flatMap((p) => Object.keys(p.types)))].sort();
  const rows = proxies.map((p) => [
    el("td", {class: "mono", "data-proxy": p.id}, p.name),
    p.type, p.istio_version || "-", p.address, p.connected, p.delta ? "delta" : "sotw",
    el("td", {}, stateBadge(p.state)),
    ...types.map((t) => el("td", {}, p.types[t] ? stateBadge(p.types[t].state) : "-")),
  ]);
  fill("proxies", table(["PROXY", "TYPE", "ISTIO VERSION", "ADDRESS", "CONNECTED", "STREAM", "SYNC",
    ...types.map((t) => t.toUpperCase())], rows, "proxy-table"));
}

function stageValues(push) {
  const s = push.stages_ms;
  const generate = Object.values(s.generate || {}).reduce((a, b) => a + b, 0);
  return {debounce: s.debounce, context_build: s.context_build, generate, queue_max: s.queue_max, send: s.send,
          converge: s.first_event_to_last_ack};
}

// One row per push, newest on top: its stages laid end to end from the first event (x in ms),
// and a mark where the last proxy ACKed (first event to last ACK).
function renderPlot(pushes) {
  if (!pushes.length) return fill("push-plot", empty("No push yet."));
  const shown = pushes.slice(0, 15);
  const values = shown.map(stageValues);
  const longest = Math.max(1, ...values.map((v) => Math.max(v.converge || 0,
    STAGES.reduce((a, [k]) => a + (v[k] || 0), 0))));
  const left = 170, width = 900, row = 18, top = 8, plotW = width - left - 20;
  const height = top + shown.length * row + 30;
  const plot = svg("svg", {width: "100%", viewBox: `0 0 ${width} ${height}`, role: "img", id: "push-svg",
                           "aria-label": "push timeline"});
  const x = (v) => left + (v / longest) * plotW;
  for (let i = 0; i <= 4; i++) {
    const v = (longest * i) / 4;
    plot.appendChild(svg("line", {x1: x(v), x2: x(v), y1: top, y2: height - 22, stroke: "#eef0f4"}));
    plot.appendChild(svg("text", {x: x(v), y: height - 8, "text-anchor": "middle"}, ms(v)));
  }
  shown.forEach((p, i) => {
    const y = top + i * row;
    const label = p.started.slice(11, 19) + "  " + (p.full ? "full" : "eds") + "  " + Object.keys(p.reasons).join(",");
    plot.appendChild(svg("text", {x: 4, y: y + 12}, label.slice(0, 34)));
    let at = 0;
    const v = values[i];
    for (const [key, color, name] of STAGES) {
      const d = v[key] || 0;
      if (d <= 0) continue;
      const rect = svg("rect", {x: x(at), y: y + 3, width: Math.max(1, x(at + d) - x(at)), height: row - 6,
                                fill: color, class: "stage-" + key});
      rect.appendChild(svg("title", {}, `${p.version}: ${name} ${ms(d)}`));
      plot.appendChild(rect);
      at += d;
    }
    if (v.converge > 0) {
      const mark = svg("circle", {cx: x(v.converge), cy: y + row / 2, r: 3.5, fill: "#d62728", class: "converged"});
      mark.appendChild(svg("title", {}, `${p.version}: first event to last ACK ${ms(v.converge)}`));
      plot.appendChild(mark);
    }
  });
  const legend = el("div", {class: "legend"},
    STAGES.map(([, color, name]) => el("span", {}, el("i", {style: "background:" + color}), name)),
    el("span", {}, el("i", {style: "background:#d62728;border-radius:5px"}), "last proxy ACKed"));
  fill("push-plot", plot, legend);
}

function renderPushes(pushes) {
  if (!pushes.length) return fill("pushes", empty(""));
  const rows = pushes.slice(0, 10).map((p) => {
    const v = stageValues(p);
    return [el("td", {class: "mono"}, p.version), p.started, p.full ? "full" : "eds",
      Object.entries(p.reasons).map(([k, n]) => k + "×" + n).join(", "),
      el("td", {class: "mono"}, p.config_keys.slice(0, 3).join(", ") + (p.config_keys.length > 3 ? ", …" : "")),
      el("td", {class: "num"}, p.proxies), el("td", {class: "num"}, p.responses),
      el("td", {class: "num"}, p.acks), el("td", {class: "num" + (p.nacks ? " err" : "")}, p.nacks),
      el("td", {class: "num"}, ms(v.converge))];
  });
  fill("pushes", table(["VERSION", "STARTED", "KIND", "REASONS", "CHANGED", "PROXIES", "RESPONSES", "ACKS",
    "NACKS", "CONVERGED"], rows, "push-table"));
}

function renderRejected(rejected, unsupported) {
  const nodes = [];
  if (rejected.length) {
    nodes.push(table(["KIND", "NAMESPACE/NAME", "SOURCE", "REASON"], rejected.map((r) => [r.kind,
      r.namespace + "/" + r.name, el("td", {class: "mono"}, r.source), el("td", {class: "err"}, r.reason)]),
      "rejected-table"));
  } else {
    nodes.push(empty("No config is rejected."));
  }
  if (unsupported.length) {
    nodes.push(el("h2", {}, "Accepted, applied differently"),
      el("ul", {}, unsupported.map((u) => el("li", {}, typeof u === "string" ? u : JSON.stringify(u)))));
  }
  fill("rejected", ...nodes);
}

function renderNacks(nacks) {
  if (!nacks.length) return fill("nacks", empty("No proxy is rejecting config."));
  fill("nacks", table(["PROXY", "TYPE", "AT", "CONFIG", "MESSAGE"], nacks.map((n) => [
    el("td", {class: "mono"}, n.proxy), n.type, n.at, el("td", {class: "mono"}, n.config.join(", ") || "-"),
    el("td", {class: "err"}, n.message)]), "nack-table"));
}

let shownScopes = "";

function renderScopes(scopes, levels) {
  const key = JSON.stringify(scopes);
  if (key === shownScopes) return;  // keep an open select as it is while nothing changed
  shownScopes = key;
  const rows = scopes.map((s) => {
    const select = el("select", {name: "level-" + s.name, id: "level-" + s.name, "data-scope": s.name},
      levels.map((l) => {
        const o = el("option", {value: l}, l);
        if (l === s.output_level) o.selected = true;
        return o;
      }));
    select.addEventListener("change", () => setLevel(s.name, select.value));
    return [el("td", {class: "mono"}, s.name), el("td", {}, select),
      s.name === "default" ? "for every scope without its own" : (s.own_level ? "own level" : "from default")];
  });
  fill("scopes", table(["SCOPE", "LEVEL", ""], rows, "scope-table"));
}

async function setLevel(scope, level) {
  const status = document.getElementById("scope-status");
  status.textContent = `setting ${scope} to ${level}…`;
  try {
    const r = await fetch("/debug/scopes/" + encodeURIComponent(scope), {
      method: "PUT", headers: {"Content-Type": "application/json"}, body: JSON.stringify({output_level: level}),
    });
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    status.textContent = `${body.name} is now at ${body.output_level}`;
    status.className = "done";
    status.id = "scope-status";
    status.setAttribute("data-changed", body.name + ":" + body.output_level);
  } catch (e) {
    status.textContent = `could not set ${scope}: ${e.message}`;
    status.className = "err";
  }
  shownScopes = "";
  refresh();
}

function renderMemory(m, p) {
  const rows = [
    ["resident memory", bytes(m.rss_bytes)], ["peak resident", bytes(m.peak_rss_bytes)],
    ["virtual", bytes(m.virtual_bytes)], ["data segment", bytes(m.data_bytes)],
    ["GC collections (gen 0/1/2)", m.gc.generations.map((g) => g.collections).join(" / ")],
    ["GC thresholds", m.gc.thresholds.join(" / ")],
    ["pid", p.pid], ["started", p.started + " (" + p.uptime_seconds + " s ago)"],
    ["CPU user / system", p.cpu_seconds.user + " s / " + p.cpu_seconds.system + " s"],
    ["threads", p.threads ?? "-"], ["open file descriptors", p.open_fds ?? "-"],
    ["worst event-loop lag", p.event_loop_lag_max_seconds === null ? "-" : ms(p.event_loop_lag_max_seconds * 1000)],
    ["python", p.python + " on " + p.platform], ["host", p.hostname], ["cwd", p.cwd],
    ["command", el("td", {class: "mono"}, p.argv.join(" "))],
  ];
  fill("memory", table(["", ""], rows, "memory-table"));
}

function renderEnv(env) {
  fill("env", table(["NAME", "VALUE", "READ AS"], env.map((e) => [el("td", {class: "mono"}, e.name),
    el("td", {class: "mono" + (e.redacted ? " empty" : "")}, e.value),
    e.knob ? e.knob : (e.unknown ? el("td", {class: "err"}, "no knob reads this PILOT_* variable") : "")]), "env-table"));
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("/debug/controlz", {cache: "no-store"});
    if (!r.ok) throw new Error(r.status + " " + (await r.text()).slice(0, 200));
    const d = await r.json();
    document.getElementById("build").textContent = `${d.process.version.tag || ""} · push context ${d.version}`;
    renderProxies(d.proxies);
    renderPlot(d.pushes);
    renderPushes(d.pushes);
    renderRejected(d.rejected, d.unsupported);
    renderNacks(d.nacks);
    renderScopes(d.scopes, d.levels);
    renderMemory(d.memory, d.process);
    renderEnv(d.env);
    status.textContent = "updated " + d.generated;
    status.className = "";
    document.body.setAttribute("data-loaded", "true");
  } catch (e) {
    status.textContent = "cannot read /debug/controlz: " + e.message;
    status.className = "err";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
