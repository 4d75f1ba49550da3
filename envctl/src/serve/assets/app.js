"use strict";
// The web view of an environment: every figure comes from the JSON API, as the signed-in
// person; the token is read from the URL's fragment once and kept for this tab only.

const TOKEN_KEY = "environment-token";
(function takeToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + "#history");
  }
})();
const token = () => sessionStorage.getItem(TOKEN_KEY) || "";
const $ = (id) => document.getElementById(id);
const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return e;
};

async function api(method, params = {}) {
  const r = await fetch("/api/v1/" + method, {
    method: "POST",
    headers: { "Authorization": "Bearer " + token(), "Content-Type": "application/json" },
    body: JSON.stringify(params),
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = new Error((body.error && body.error.message) || r.statusText);
    e.status = r.status;
    e.body = body;
    throw e;
  }
  return body;
}

function showError(e) {
  const box = $("error");
  box.hidden = false;
  box.textContent = e.status ? `${e.status}: ${e.message}` : String(e);
}

// ---- views ---------------------------------------------------------------------------------

function route() {
  const [view, arg] = (location.hash.slice(1) || "history").split("/");
  for (const s of document.querySelectorAll(".view")) s.hidden = true;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
  $("error").hidden = true;
  const show = { history: loadHistory, op: () => loadOp(arg), approvals: loadApprovals, queue: loadQueue, effects: loadEffects, policy: () => {} }[view] || loadHistory;
  $("view-" + (show === loadHistory ? "history" : view)).hidden = false;
  show().catch(showError);
}
window.addEventListener("hashchange", route);

function opLine(line, fresh) {
  if (line.type === "captures") {
    const li = el("li", { class: "captures", "data-newest": line.newest },
      el("span", { class: "text" }, `${line.count} automatic capture(s), ${line.changed} key(s) changed`));
    li.addEventListener("click", () => expandCaptures(li, line));
    return li;
  }
  const kind = line.intent.kind;
  const li = el("li", { class: kind + (fresh ? " fresh" : ""), "data-id": line.id, "data-seq": line.seq },
    el("span", { class: "text" },
      el("span", { class: "seq" }, "#" + line.seq),
      el("span", { class: "actor" }, line.actor), " ",
      `${kind}: ${line.intent.text}`,
      ...line.marks.map((m) => el("span", { class: "mark" }, m)),
      line.restored_from ? el("small", {}, `  back to ${line.restored_from.slice(0, 12)}`) : "",
      line.flags.length ? el("small", {}, "  [" + line.flags.join(", ") + "]") : ""));
  li.addEventListener("click", () => { location.hash = "op/" + line.id; });
  return li;
}

async function expandCaptures(li, line) {
  const h = await api("history", { all: true, limit: 1000 });
  const inside = h.entries.filter((e) => e.type === "op" && e.time_ms >= line.from_ms && e.time_ms <= line.to_ms);
  li.replaceWith(...inside.map((e) => opLine(e, false)));
}

// ---- the history as a graph -----------------------------------------------------------------
// One lane per branch (the workspace's first), one row per operation or run of captures, newest
// first. A branch's lane runs from its newest row down to the row it forked from; a merge joins
// the merged branch's lane; a rollback is drawn as a diamond.

const ROW = 26, LANE = 16;
let shownSeq = 0;

async function loadHistory() {
  const [main, list] = await Promise.all([
    api("history", { limit: 200 }),
    api("branch.list").catch(() => ({ branches: [] })),
  ]);
  const others = list.branches.filter((b) => b.name !== main.branch);
  const more = await Promise.all(others.map((b) => api("history", { branch: b.name, limit: 200 }).catch(() => null)));
  const fresh = shownSeq;
  drawGraph([main, ...more.filter(Boolean)], fresh);
  $("head").textContent = `${main.branch} at ${main.head.slice(0, 12)}`;
}

function drawGraph(histories, freshAfter) {
  const lanes = new Map(histories.map((h, i) => [h.branch, i]));
  const rows = [], seen = new Set();
  for (const h of histories) {
    for (const e of h.entries) {
      const key = e.type === "op" ? e.id : "captures:" + e.newest;
      if (seen.has(key)) continue;
      seen.add(key);
      const lane = e.type === "op" && lanes.has(e.branch) ? lanes.get(e.branch) : lanes.get(h.branch);
      rows.push({ e, lane, time: e.type === "op" ? e.time_ms : e.to_ms, seq: e.seq || 0 });
    }
  }
  rows.sort((a, b) => b.time - a.time || b.seq - a.seq);
  const rowOf = new Map(rows.map((r, i) => [r.e.type === "op" ? r.e.id : r.e.newest, i]));
  // Each lane's span (newest row to oldest), then the forks and merges that stretch it.
  const span = new Map();
  rows.forEach((r, i) => {
    const s = span.get(r.lane) || { top: i, bottom: i };
    s.bottom = i;
    span.set(r.lane, s);
  });
  const forks = [], merges = [];
  for (const [lane, s] of span) {
    const oldest = rows[s.bottom].e;
    const parent = oldest.type === "op" ? oldest.parents[0] : null;
    if (lane !== 0 && parent && rowOf.has(parent)) {
      const at = rowOf.get(parent);
      if (rows[at].lane !== lane) { s.bottom = at; forks.push({ row: at, from: rows[at].lane, to: lane }); }
    }
  }
  rows.forEach((r, i) => {
    if (r.e.type !== "op" || !r.e.flags.includes("merge") || r.e.parents.length < 2) return;
    const source = rowOf.get(r.e.parents[1]);
    if (source === undefined || rows[source].lane === r.lane) return;
    const s = span.get(rows[source].lane);
    s.top = Math.min(s.top, i);
    merges.push({ row: i, from: rows[source].lane, to: r.lane });
  });
  const width = LANE * (Math.max(0, ...span.keys()) + 1) + 4;
  const x = (lane) => LANE / 2 + lane * LANE + 2;
  const svgNS = "http://www.w3.org/2000/svg";
  const shape = (tag, attrs) => {
    const n = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    return n;
  };
  const items = rows.map((r, i) => {
    const li = opLine(r.e, r.e.type === "op" && freshAfter > 0 && r.e.seq > freshAfter);
    const svg = shape("svg", { class: "graph", width, height: ROW, viewBox: `0 0 ${width} ${ROW}` });
    for (const [lane, s] of span) {
      if (i < s.top || i > s.bottom) continue;
      const y1 = i === s.top ? ROW / 2 : 0, y2 = i === s.bottom ? ROW / 2 : ROW;
      if (y1 !== y2) svg.append(shape("line", { class: "lane", "data-lane": lane, x1: x(lane), x2: x(lane), y1, y2 }));
    }
    for (const f of forks.filter((f) => f.row === i)) {
      svg.append(shape("line", { class: "fork-edge", x1: x(f.from), x2: x(f.to), y1: ROW / 2, y2: ROW / 2 }));
    }
    for (const m of merges.filter((m) => m.row === i)) {
      svg.append(shape("line", { class: "merge-edge", x1: x(m.from), x2: x(m.to), y1: ROW / 2, y2: ROW / 2 }));
    }
    const cx = x(r.lane), cy = ROW / 2;
    const rollback = r.e.type === "op" && (r.e.flags.includes("rollback") || ["restore", "undo", "redo"].includes(r.e.intent.kind));
    if (r.e.type === "captures") svg.append(shape("circle", { class: "dot captures", "data-lane": r.lane, cx, cy, r: 3 }));
    else if (rollback) svg.append(shape("polygon", { class: "dot rollback", "data-lane": r.lane, points: `${cx},${cy - 6} ${cx + 6},${cy} ${cx},${cy + 6} ${cx - 6},${cy}` }));
    else svg.append(shape("circle", { class: "dot", "data-lane": r.lane, cx, cy, r: 5 }));
    li.prepend(svg);
    return li;
  });
  const legend = [...lanes].filter(([, lane]) => span.has(lane)).map(([name, lane]) =>
    el("span", { class: "branch lane-" + (lane % 6) }, name));
  $("branches").replaceChildren(...legend);
  $("history").replaceChildren(...items);
  shownSeq = rows.reduce((most, r) => Math.max(most, r.seq), shownSeq);
}

// A new operation: the graph is drawn again (once for a burst), its new rows highlighted.
let redraw = null;
function addLive(line) {
  if (line.seq <= shownSeq || redraw) return;
  redraw = setTimeout(() => {
    redraw = null;
    if (!$("view-history").hidden) loadHistory().catch(showError);
  }, 100);
}

async function loadOp(id) {
  const op = await api("show", { version: id });
  $("op-title").textContent = `#${op.seq} ${op.intent.kind}: ${op.intent.text}`;
  const facts = [["who", op.actor], ["when", new Date(op.time_ms).toLocaleString()], ["id", op.id],
    ["branch", op.branch], ["base version", op.base_version || "—"], ["after", op.parents.join(", ") || "—"],
    ["flags", op.flags.join(", ") || "—"], ["marks", op.marks.join(", ") || "—"],
    ["restored from", op.restored_from || "—"],
    ["let through by", op.decision ? `${op.decision.rules.join(", ") || "no rule"} (policy v${op.decision.policy_version})` : "no policy"]];
  $("op-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const changes = op.changes || [];
  $("op-changes").replaceChildren(...changes.map((c) => {
    const li = el("li", {}, `${c.change} ${c.path}`);
    if (c.namespace === "fs") li.addEventListener("click", () => showDiff(op, c).catch(showError));
    return li;
  }));
  $("op-diff").replaceChildren();
  $("restore-plan").replaceChildren();
  $("restore-done").textContent = "";
  $("restore-confirm").hidden = true;
  $("restore-preview").onclick = () => previewRestore(op.id).catch(showError);
  $("restore-confirm").onclick = () => confirmRestore(op.id).catch(showError);
}

// A file's diff, as the service computes it: hunks of lines kept, removed and added, or for a
// file that is not compared by lines, each side's size and hash.
async function showDiff(op, change) {
  const box = $("op-diff");
  if (!op.parents[0]) { box.replaceChildren(el("p", {}, `${change.path}: created with the environment`)); return; }
  const d = await api("file.diff", { path: change.path, from: op.parents[0], to: op.id });
  const side = (s) => s ? `${s.kind} of ${s.size} bytes, ${s.hash.slice(0, 16) || "no content"}` : "absent";
  if (!d.text) {
    box.replaceChildren(el("h3", {}, change.path),
      el("p", { class: "binary" }, `not compared by lines (not text, or too large): ${side(d.before)} → ${side(d.after)}`));
    return;
  }
  const pre = el("pre", { class: "diff" });
  for (const h of d.hunks) {
    pre.append(el("div", { class: "hunk" }, `@@ -${h.old_start},${h.old_lines} +${h.new_start},${h.new_lines} @@`));
    for (const l of h.lines) {
      const [cls, mark] = { add: ["add", "+ "], remove: ["del", "- "] }[l.op] || ["", "  "];
      pre.append(el("div", cls ? { class: cls } : {}, mark + l.text));
    }
  }
  if (d.truncated) pre.append(el("div", {}, "… more changes are not listed"));
  box.replaceChildren(el("h3", {}, change.path), el("p", { class: "sides" }, `${side(d.before)} → ${side(d.after)}`), pre);
}

async function previewRestore(id) {
  const plan = await api("restore", { version: id, dry_run: true });
  const s = plan.steps;
  $("restore-plan").replaceChildren(
    el("p", {}, `${s.writes} path(s) written, ${s.removals} removed:`),
    el("ul", {}, ...s.by_top.map((t) => el("li", {}, `${t.top}: ${t.written} written, ${t.removed} removed`))));
  $("restore-confirm").hidden = false;
}

async function confirmRestore(id) {
  const done = await api("restore", { version: id, intent: "restore from the web view" });
  $("restore-confirm").hidden = true;
  $("restore-done").textContent = `Restored: the workspace is at ${done.restored_to.slice(0, 12)} again (recorded as ${done.version.slice(0, 12)}).`;
}

async function loadApprovals() {
  let list;
  try { list = await api("approval.list"); } catch (e) {
    if (e.status === 503) { $("approvals").replaceChildren(el("tr", {}, el("td", { colspan: 8 }, "No policy is loaded: nothing waits for an approval."))); return; }
    throw e;
  }
  const rows = list.approvals.map((a) => {
    const actions = el("td");
    if (a.state === "pending") {
      actions.append(
        el("button", { class: "grant", onclick: () => decide("approval.grant", a.id) }, "Grant"), " ",
        el("button", { class: "reject", onclick: () => decide("approval.reject", a.id) }, "Reject"));
    }
    return el("tr", { "data-id": a.id }, el("td", {}, a.id), el("td", { class: "state" }, a.state), el("td", {}, a.actor),
      el("td", {}, a.action), el("td", {}, a.resource), el("td", {}, a.rules.join(", ")), el("td", {}, a.from.join(" or ")), actions);
  });
  $("approvals").replaceChildren(...rows);
  updatePending(list.approvals);
}

function updatePending(approvals) {
  const n = approvals.filter((a) => a.state === "pending").length;
  $("pending-count").textContent = n ? `(${n})` : "";
}

async function decide(method, id) {
  try { await api(method, { id }); await loadApprovals(); } catch (e) { showError(e); }
}

async function loadQueue() {
  let stats;
  try { stats = await api("queue.stats"); } catch (e) {
    if (e.status === 503) { $("queue").textContent = "No queue here."; return; }
    throw e;
  }
  // Leases in flight, by group: who holds which message, how long since it was published, and
  // how long the lease has left.
  const held = {};
  try {
    for (const l of (await api("queue.leases", { limit: 1000 })).leases) (held[l.group] ||= []).push(l);
  } catch (e) { if (e.status !== 403) throw e; }
  const now = Date.now();
  const secs = (ms) => `${Math.max(0, Math.round(ms / 1000))}s`;
  const board = el("div", { class: "board" });
  for (const t of stats.topics) {
    const card = el("div", { class: "topic" }, el("h3", {}, t.topic), el("p", {}, `${t.retained} message(s) kept`));
    for (const g of t.groups) {
      card.append(el("p", {}, `${g.group}: ${g.depth} waiting, ${g.in_flight} leased, ${g.dead_letters} dead`));
      const leases = (held[g.group] || []).filter((l) => l.topic === t.topic);
      if (leases.length) {
        card.append(el("ul", { class: "leases" }, ...leases.map((l) => el("li", { class: "lease" },
          `#${l.message_id} held by ${l.consumer} (attempt ${l.attempt}), ${secs(now - l.published_at_ms)} old, ${secs(l.lease_until_ms - now)} left`))));
      }
      if (g.dead_letters > 0) {
        card.append(el("button", { class: "redrive", onclick: async () => {
          try { await api("queue.redrive", { group: g.group }); await loadQueue(); } catch (e) { showError(e); }
        } }, `Redrive ${g.group}'s dead letters`));
      }
    }
    board.append(card);
  }
  $("queue").replaceChildren(board);
}

async function loadEffects() {
  const list = await api("effect.list", { unfinished: false });
  $("effects").replaceChildren(...list.effects.filter((e) => e.state !== "done").map((e) => el("tr", {},
    el("td", {}, e.id), el("td", {}, e.state), el("td", {}, e.key), el("td", {}, e.target),
    el("td", {}, e.actor), el("td", {}, e.attempts), el("td", {}, e.note || ""))));
}

$("may-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const r = await api("policy.what_may_i_do", { actor: $("may-actor").value, resource: $("may-resource").value });
    $("may").replaceChildren(...(r.policy ? r.permissions.map((p) => el("li", {}, `${p.action} ${p.resource} (rule ${p.rule}) ${p.conditions}`)) : [el("li", {}, "No policy: every action is allowed.")]));
  } catch (e) { showError(e); }
});

$("explain-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    const r = await api("policy.explain", { actor: $("explain-actor").value, action: $("explain-action").value, resource: $("explain-resource").value });
    $("explain").textContent = `${r.outcome}: ${r.explanation}`;
  } catch (e) { showError(e); }
});

// ---- live events ---------------------------------------------------------------------------

function listen() {
  const source = new EventSource("/api/v1/events?access_token=" + encodeURIComponent(token()));
  source.onopen = () => $("live").classList.add("on");
  source.onerror = () => $("live").classList.remove("on");
  source.addEventListener("operation", (ev) => addLive(JSON.parse(ev.data)));
  source.addEventListener("approval", () => {
    if (!$("view-approvals").hidden) loadApprovals().catch(showError);
    else api("approval.list").then((l) => updatePending(l.approvals)).catch(() => {});
  });
  source.addEventListener("effect", () => { if (!$("view-effects").hidden) loadEffects().catch(showError); });
  source.addEventListener("queue", () => { if (!$("view-queue").hidden) loadQueue().catch(showError); });
}

api("status").then((s) => { $("whoami").textContent = `signed in as ${s.actor}`; }).catch(showError);
route();
listen();
