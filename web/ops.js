// The operator's page: the sale, live, from the coordinator's admin API (docs/http-api.md,
// "Admin API"). It reads `GET /admin/cluster` every 2 s with the admin token and draws it: two
// charts of the last minutes (kept by this page: the API answers the present only), the SKUs
// and nodes, and the internals behind a toggle. Times are the operator's clock times. It
// changes nothing. Served by the coordinator at `/ops`, so the API is same-origin and needs no
// CORS; no inline script or style, so `default-src 'self'` holds.
"use strict";

(() => {
  const POLL_MS = 2000;
  /** A coordinator that does not answer within this is shown as unreachable, and asked again. */
  const CALL_TIMEOUT_MS = 5000;
  const TOKEN_KEY = "seckill.adminToken";
  /** How far back the charts reach. */
  const HISTORY_MS = 5 * 60 * 1000;
  const SVG = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  const view = {
    login: $("login"),
    token: $("token"),
    forget: $("forget"),
    updated: $("updated"),
    error: $("error"),
    skus: $("skus").tBodies[0],
    nodes: $("nodes").tBodies[0],
    allotments: $("allotments").tBodies[0],
    workers: $("workers"),
    cluster: $("cluster"),
    unitsChart: $("chart-units"),
    requestsChart: $("chart-requests"),
  };

  const state = {
    token: readToken(),
    /** Bumped to stop a poll loop: a loop that sees a newer number ends. */
    loop: 0,
    /** Per SKU and figure: the last reading of a count that never decreases, and when. */
    previous: new Map(),
    /** One point per read for the charts: `{ at, sold, requestsPerS }`, oldest first. */
    history: [],
  };

  function readToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || null;
    } catch (_) {
      return null;
    }
  }

  function keepToken(token) {
    try {
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {
      // Storage off: the token lasts as long as this page.
    }
  }

  // --- polling --------------------------------------------------------------------------

  function startPolling() {
    state.loop += 1;
    state.previous.clear();
    state.history = [];
    poll(state.loop);
  }

  function stopPolling(message) {
    state.loop += 1;
    view.updated.textContent = "Not connected";
    view.error.textContent = message;
  }

  async function poll(loop) {
    if (loop !== state.loop || !state.token) return;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), CALL_TIMEOUT_MS);
    try {
      const response = await fetch("/admin/cluster", {
        headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
        credentials: "omit",
        cache: "no-store",
        signal: controller.signal,
      });
      const body = await response.json().catch(() => null);
      if (loop !== state.loop) return;
      if (response.status === 401) {
        state.token = null;
        keepToken(null);
        stopPolling("The coordinator refused this token.");
        return;
      }
      if (response.status === 403) {
        stopPolling("The admin API is off on this coordinator (no admin token configured).");
        return;
      }
      if (response.status !== 200 || !body) {
        view.error.textContent = "The coordinator answered " + response.status + (body && body.message ? ": " + body.message : "");
      } else {
        view.error.textContent = "";
        render(body);
      }
    } catch (_) {
      if (loop === state.loop) view.error.textContent = "Cannot reach the coordinator; asking again…";
    } finally {
      clearTimeout(timer);
    }
    setTimeout(() => poll(loop), POLL_MS);
  }

  // --- drawing --------------------------------------------------------------------------

  function render(cluster) {
    const now = Date.now();
    const nodes = cluster.nodes || {};
    const skus = cluster.skus || {};
    const names = Object.keys(skus).sort();
    view.skus.replaceChildren(...names.map((sku) => skuRow(sku, skus[sku], now)));
    view.allotments.replaceChildren(...names.map((sku) => allotmentRow(sku, skus[sku], nodes)));
    view.nodes.replaceChildren(...Object.keys(nodes).sort().map((id) => nodeRow(id, nodes[id], now)));
    view.workers.textContent =
      "Worker ids: " +
      (Object.keys(nodes).sort().map((id) => id + " " + text(nodes[id].worker_id)).join(", ") || "—");
    view.cluster.textContent =
      "Member " + text(cluster.member) + " · leader " + text(cluster.leader) + " · term " + text(cluster.term) +
      " · log index " + text(cluster.last_log_index);
    remember(skus, now);
    chart(view.unitsChart, state.history.map((point) => [point.at, point.sold]), 0);
    chart(view.requestsChart, state.history.map((point) => [point.at, point.requestsPerS]), 1);
    view.updated.textContent = "Updated " + clock(now) + " from member " + text(cluster.member);
  }

  /** Adds this read to the charts' history: units sold and the request rate over every SKU. */
  function remember(skus, now) {
    let sold = 0;
    let requests = 0;
    for (const entry of Object.values(skus)) {
      const ledger = entry.ledger || {};
      if (typeof ledger.sold === "number") sold += ledger.sold;
      if (typeof entry.requests_total === "number") requests += entry.requests_total;
    }
    const rate = Number(perSecond("every SKU's requests", requests, now));
    state.history.push({ at: now, sold, requestsPerS: Number.isFinite(rate) ? rate : null });
    while (state.history.length > 0 && state.history[0].at < now - HISTORY_MS) state.history.shift();
  }

  /** Draws `points` (`[ms, value]`, value null where unknown) as a line with its clock times
   *  and its largest value; the points are kept on the element (`data-points`) for tests and
   *  for anyone who wants the numbers. */
  function chart(svg, points, decimals) {
    const known = points.filter(([, value]) => typeof value === "number");
    svg.dataset.points = JSON.stringify(known);
    const [width, height, left, bottom, top] = [600, 170, 56, 22, 10];
    const shapes = [];
    const label = (x, y, content, anchor) => {
      const node = document.createElementNS(SVG, "text");
      node.setAttribute("x", x);
      node.setAttribute("y", y);
      node.setAttribute("text-anchor", anchor);
      node.textContent = content;
      shapes.push(node);
    };
    const max = Math.max(1, ...known.map(([, value]) => value));
    const axis = document.createElementNS(SVG, "path");
    axis.setAttribute("class", "axis");
    axis.setAttribute("d", `M${left},${top} V${height - bottom} H${width}`);
    shapes.push(axis);
    label(left - 6, top + 10, max.toFixed(decimals), "end");
    label(left - 6, height - bottom, "0", "end");
    if (known.length > 0) {
      const first = known[0][0];
      const span = Math.max(1, known[known.length - 1][0] - first);
      const x = (at) => left + ((at - first) / span) * (width - left - 4);
      const y = (value) => height - bottom - (value / max) * (height - bottom - top);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", "line");
      line.setAttribute("points", known.map(([at, value]) => x(at).toFixed(1) + "," + y(value).toFixed(1)).join(" "));
      shapes.push(line);
      label(left, height - 6, clock(first), "start");
      label(width, height - 6, clock(known[known.length - 1][0]), "end");
    } else {
      label((width + left) / 2, height / 2, "waiting for two reads…", "middle");
    }
    svg.replaceChildren(...shapes);
  }

  function skuRow(sku, entry, now) {
    const ledger = entry.ledger || {};
    const terms = entry.terms || {};
    const row = document.createElement("tr");
    row.dataset.sku = sku;
    row.append(rowHeader(sku));
    if (ledger.error) {
      const cell = cellOf("The ledger did not answer: " + ledger.error, "unavailable");
      cell.colSpan = 4;
      row.append(cell);
    } else {
      row.append(
        number(ledger.sold),
        number(ledger.remaining),
        number(ledger.total),
        figure(cellOf(unitsPerSecond(sku, ledger, now), "number"), "units-per-s"),
      );
    }
    row.append(
      figure(cellOf(perSecond(sku + " requests", entry.requests_total, now), "number"), "requests-per-s"),
      list(orders(entry, ledger)),
      saleState(terms, ledger, now),
    );
    return row;
  }

  /** The SKU's internals: releases, grants, each node's allotment, the waiting room's figures. */
  function allotmentRow(sku, entry, nodes) {
    const ledger = entry.ledger || {};
    const row = document.createElement("tr");
    row.dataset.sku = sku;
    row.append(
      rowHeader(sku),
      number(ledger.released),
      number(entry.granted_to_live_nodes),
      list(perNode(sku, nodes)),
      list(pairs(entry.room), "no waiting room figures from the coordinator"),
    );
    return row;
  }

  function rowHeader(content) {
    const header = document.createElement("th");
    header.scope = "row";
    header.textContent = content;
    return header;
  }

  /** Names a cell's figure for whoever reads the table by script (the browser test). */
  function figure(cell, name) {
    cell.dataset.figure = name;
    return cell;
  }

  /** Units sold per second between two reads: sold + released only grows, a release included. */
  function unitsPerSecond(sku, ledger, now) {
    if (typeof ledger.sold !== "number") return "—";
    return perSecond(sku + " units", ledger.sold + (ledger.released || 0), now);
  }

  /** The rate of a cumulative count between this read and the last (`key` names the count). */
  function perSecond(key, count, now) {
    if (typeof count !== "number") return "—";
    const before = state.previous.get(key);
    state.previous.set(key, { count, at: now });
    if (!before || now <= before.at || count < before.count) return "—";
    return ((count - before.count) / ((now - before.at) / 1000)).toFixed(1);
  }

  /** Each node holding or reporting this SKU: its allotment left, its sales, its grant. */
  function perNode(sku, nodes) {
    const items = [];
    for (const id of Object.keys(nodes).sort()) {
      const record = nodes[id];
      const report = (record.reports || {})[sku];
      const granted = (record.granted || {})[sku];
      if (report === undefined && granted === undefined) continue;
      let line = id + ": ";
      line += report ? report.local_remaining + " left, sold " + report.sold : "no report yet";
      if (granted !== undefined) line += ", granted " + granted;
      if (report && report.ledger_reachable === false) line += ", cannot reach the ledger";
      if (!record.live) line += " (not live)";
      items.push(line);
    }
    return items;
  }

  /** Orders by state when the coordinator reports them; the ledger's order count otherwise. */
  function orders(entry, ledger) {
    const byState = pairs(entry.orders_by_state);
    if (byState.length > 0) return byState;
    return typeof ledger.orders === "number" ? [ledger.orders + " sold (ledger)"] : [];
  }

  /** `key: value` lines of an object whose fields the coordinator names; nested objects (the
   *  room's draw) flattened with their key as a prefix. */
  function pairs(object, prefix = "") {
    if (!object || typeof object !== "object") return [];
    return Object.keys(object).flatMap((key) => {
      const value = object[key];
      // A Unix-ms instant (`draw_at_ms`) reads as the clock time it names.
      const instant = /_at_ms$/.test(key) && typeof value === "number" && value > 1e12;
      const name = prefix + (instant ? key.replace(/_ms$/, "") : key).replace(/_/g, " ");
      if (value && typeof value === "object" && !Array.isArray(value)) return pairs(value, name + " ");
      return [name + ": " + (instant ? clock(value) : text(value))];
    });
  }

  function saleState(terms, ledger, now) {
    if (terms.closed || ledger.closed) return cellOf("closed", "closed");
    if (typeof terms.starts_at_ms === "number" && now < terms.starts_at_ms) {
      const wait = Math.ceil((terms.starts_at_ms - now) / 1000);
      return cellOf("starts at " + clock(terms.starts_at_ms) + " (in " + wait + " s)");
    }
    if (typeof terms.ends_at_ms === "number" && now >= terms.ends_at_ms) return cellOf("ended", "closed");
    if (ledger.remaining === 0) return cellOf("sold out");
    return cellOf("selling", "live");
  }

  function nodeRow(id, record, now) {
    const row = document.createElement("tr");
    const until = record.lease_until_ms;
    const lease =
      typeof until !== "number" || !record.live
        ? "—"
        : clock(until) + " (" + Math.max(0, (until - now) / 1000).toFixed(1) + " s)";
    row.append(
      rowHeader(id),
      cellOf(record.live ? "live" : "not live", record.live ? "live" : "dead"),
      number(record.epoch),
      cellOf(lease),
      cellOf(text(record.addr)),
    );
    return row;
  }

  /** A Unix-ms instant as this browser's clock time. */
  const clock = (ms) => new Date(ms).toLocaleTimeString();

  function cellOf(content, className) {
    const cell = document.createElement("td");
    cell.textContent = content;
    if (className) cell.className = className;
    return cell;
  }

  const number = (value) => cellOf(typeof value === "number" ? String(value) : "—", "number");

  function list(items, missing) {
    const cell = document.createElement("td");
    cell.className = "list";
    if (items.length === 0) {
      cell.textContent = "—";
      cell.classList.add("none");
      if (missing) cell.title = missing;
      return cell;
    }
    for (const item of items) {
      const span = document.createElement("span");
      span.className = "item";
      span.textContent = item;
      cell.append(span);
    }
    return cell;
  }

  const text = (value) => (value === null || value === undefined ? "—" : String(value));

  // --- wiring ---------------------------------------------------------------------------

  view.login.addEventListener("submit", (event) => {
    event.preventDefault();
    const token = view.token.value.trim();
    if (!token) return;
    state.token = token;
    keepToken(token);
    view.token.value = "";
    view.error.textContent = "";
    view.updated.textContent = "Connecting…";
    startPolling();
  });

  view.forget.addEventListener("click", () => {
    state.token = null;
    keepToken(null);
    view.skus.replaceChildren();
    view.nodes.replaceChildren();
    view.allotments.replaceChildren();
    state.history = [];
    stopPolling("");
  });

  if (state.token) {
    view.updated.textContent = "Connecting…";
    startPolling();
  }
})();
