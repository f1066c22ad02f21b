// The operator's page: the sale, live, from the coordinator's admin API (docs/http-api.md,
// "Admin API"). It reads `GET /admin/cluster` every 2 s with the admin token and draws it; it
// changes nothing. Served by the coordinator at `/ops`, so the API is same-origin and needs no
// CORS; no inline script or style, so `default-src 'self'` holds.
"use strict";

(() => {
  const POLL_MS = 2000;
  /** A coordinator that does not answer within this is shown as unreachable, and asked again. */
  const CALL_TIMEOUT_MS = 5000;
  const TOKEN_KEY = "seckill.adminToken";

  const $ = (id) => document.getElementById(id);
  const view = {
    login: $("login"),
    token: $("token"),
    forget: $("forget"),
    updated: $("updated"),
    error: $("error"),
    skus: $("skus").tBodies[0],
    nodes: $("nodes").tBodies[0],
    cluster: $("cluster"),
  };

  const state = {
    token: readToken(),
    /** Bumped to stop a poll loop: a loop that sees a newer number ends. */
    loop: 0,
    /** Per SKU and figure: the last reading of a count that never decreases, and when. */
    previous: new Map(),
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
    const rows = Object.keys(skus)
      .sort()
      .map((sku) => skuRow(sku, skus[sku], nodes, now));
    view.skus.replaceChildren(...rows);
    view.nodes.replaceChildren(...Object.keys(nodes).sort().map((id) => nodeRow(id, nodes[id], now)));
    view.cluster.textContent =
      "Member " + text(cluster.member) + " · leader " + text(cluster.leader) + " · term " + text(cluster.term) +
      " · log index " + text(cluster.last_log_index);
    view.updated.textContent = "Updated " + new Date(now).toLocaleTimeString() + " from member " + text(cluster.member);
  }

  function skuRow(sku, entry, nodes, now) {
    const ledger = entry.ledger || {};
    const terms = entry.terms || {};
    const row = document.createElement("tr");
    row.dataset.sku = sku;
    const header = document.createElement("th");
    header.scope = "row";
    header.textContent = sku;
    row.append(header);
    if (ledger.error) {
      const cell = cellOf("The ledger did not answer: " + ledger.error, "unavailable");
      cell.colSpan = 5;
      row.append(cell);
    } else {
      row.append(
        number(ledger.sold),
        number(ledger.remaining),
        number(ledger.total),
        number(ledger.released),
        cellOf(unitsPerSecond(sku, ledger, now), "number"),
      );
    }
    row.append(
      cellOf(perSecond(sku + " requests", entry.requests_total, now), "number"),
      number(entry.granted_to_live_nodes),
      list(perNode(sku, nodes)),
      list(pairs(entry.room), "no waiting room figures from the coordinator"),
      list(orders(entry, ledger)),
      saleState(terms, ledger, now),
    );
    return row;
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
      const name = prefix + key.replace(/_/g, " ");
      const value = object[key];
      if (value && typeof value === "object" && !Array.isArray(value)) return pairs(value, name + " ");
      return [name + ": " + text(value)];
    });
  }

  function saleState(terms, ledger, now) {
    if (terms.closed || ledger.closed) return cellOf("closed", "closed");
    if (typeof terms.starts_at_ms === "number" && now < terms.starts_at_ms) {
      return cellOf("starts in " + Math.ceil((terms.starts_at_ms - now) / 1000) + " s");
    }
    if (typeof terms.ends_at_ms === "number" && now >= terms.ends_at_ms) return cellOf("ended", "closed");
    if (ledger.remaining === 0) return cellOf("sold out");
    return cellOf("selling", "live");
  }

  function nodeRow(id, record, now) {
    const row = document.createElement("tr");
    const header = document.createElement("th");
    header.scope = "row";
    header.textContent = id;
    const leaseLeft = typeof record.lease_until_ms === "number" ? (record.lease_until_ms - now) / 1000 : null;
    row.append(
      header,
      cellOf(record.live ? "live" : "not live", record.live ? "live" : "dead"),
      number(record.epoch),
      cellOf(leaseLeft === null || !record.live ? "—" : Math.max(0, leaseLeft).toFixed(1) + " s", "number"),
      cellOf(text(record.worker_id)),
      cellOf(text(record.addr)),
    );
    return row;
  }

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
    stopPolling("");
  });

  if (state.token) {
    view.updated.textContent = "Connecting…";
    startPolling();
  }
})();
