// The buyer's page of a flash sale behind the waiting room (docs/http-api.md, "Waiting room").
//
// Everything here shapes the crowd before it reaches a node: the buy button opens only at the
// start on the server's clock, a press counts at most once per 2 s, and a press buys only with
// the ticket the room hands out when it is this buyer's turn. Pushed changes (position, turn,
// sold out, reopened) arrive on one event stream per waiter, so no page polls the room.
//
// No framework, no build step, no inline script or style: the page runs under a
// Content-Security-Policy of `default-src 'self'`. No cookies: the buyer's id lives in
// sessionStorage (one tab, one buyer), a signed-in buyer's token in the URL fragment, which
// never leaves the browser.
"use strict";

(() => {
  /** Ids of SKUs and buyers, as the node checks them. */
  const ID_PATTERN = /^[A-Za-z0-9_.:-]{1,64}$/;
  /** The least time between two presses that count: the crowd's first brake. */
  const PRESS_GAP_MS = 2000;
  /** The clock offset drifts and the room's state changes without a push to outsiders. */
  const ROOM_RESYNC_MS = 30000;
  const ROOM_FIRST_RETRY_MS = 2000;
  const STOCK_POLL_MS = 2000;
  /** While a payment settles, the order is read this often; otherwise only to notice expiry. */
  const ORDER_FAST_POLL_MS = 1000;
  const ORDER_SLOW_POLL_MS = 5000;
  /** An order appears within a second of the purchase; past this something is wrong. */
  const ORDER_FAST_POLLS_MAX = 120;
  /** Every call gives up after this; a retry (same Idempotency-Key) settles what it did. */
  const CALL_TIMEOUT_MS = 10000;
  /** A server asking for more than this is treated as asking for this. */
  const RETRY_AFTER_MAX_S = 30;
  /** Retries of one purchase attempt, one join, one press of pay. */
  const RETRIES_MAX = 20;
  const TICK_MS = 250;
  const BUYER_KEY = "seckill.buyer";

  const $ = (id) => document.getElementById(id);
  const view = {
    title: $("title"),
    countdown: $("countdown"),
    stock: $("stock"),
    buy: $("buy"),
    position: $("position"),
    result: $("result"),
    order: $("order"),
    orderId: $("order-id"),
    orderState: $("order-state"),
    orderDeadline: $("order-deadline"),
    pay: $("pay"),
    payStatus: $("pay-status"),
    buyer: $("buyer"),
  };

  const page = {
    sku: skuOfPath(),
    identity: identity(),
    /** server clock − local clock, from the last room read; valid once `synced`. */
    offsetMs: 0,
    synced: false,
    startsAtMs: null,
    /** "open", "sold_out" or "ended", from the room or the stream. */
    saleState: "open",
    soldOut: false,
    waiter: null,
    joining: false,
    joinTries: 0,
    stream: null,
    status: null,
    /** The tick that saw the start has run. */
    startSeen: false,
    /** The buyer pressed buy: a turn is taken at once. */
    intent: false,
    pressAllowedAt: 0,
    /** One purchase attempt: its Idempotency-Key is reused on every retry of it. */
    attempt: null,
    purchasing: false,
    purchased: false,
    /** A ticket is single-use: never start a second attempt with one already sent. */
    spentTicket: null,
    order: null,
    paying: false,
    orderPolls: 0,
    /** Bumped to restart the order poll: an older loop sees it and stops. */
    orderPollLoop: 0,
    syncTimer: null,
  };

  // --- identity and paths ---------------------------------------------------------------

  function skuOfPath() {
    const parts = location.pathname.split("/").filter(Boolean);
    if (parts.length < 2 || parts[parts.length - 2] !== "sale") return null;
    let sku;
    try {
      sku = decodeURIComponent(parts[parts.length - 1]);
    } catch (_) {
      return null;
    }
    return ID_PATTERN.test(sku) ? sku : null;
  }

  function identity() {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    const token = fragment.get("token");
    if (token) return { bearer: token, user: null, label: subjectOf(token) || "your signed-in account" };
    const user = fragment.get("user");
    if (user && ID_PATTERN.test(user)) return { bearer: null, user, label: user };
    const stored = storedBuyer();
    return { bearer: null, user: stored, label: stored };
  }

  /** The JWT's `sub`, to show whom the page buys for; the server verifies, this only displays. */
  function subjectOf(token) {
    try {
      const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      const sub = JSON.parse(atob(payload)).sub;
      return typeof sub === "string" ? sub : null;
    } catch (_) {
      return null;
    }
  }

  function storedBuyer() {
    let id = null;
    try {
      id = sessionStorage.getItem(BUYER_KEY);
    } catch (_) {
      // Storage can be off (privacy settings): the id then lasts as long as this page.
    }
    if (id && ID_PATTERN.test(id)) return id;
    id = "buyer-" + randomHex(8);
    try {
      sessionStorage.setItem(BUYER_KEY, id);
    } catch (_) {
      // As above.
    }
    return id;
  }

  function randomHex(bytes) {
    const buffer = new Uint8Array(bytes);
    crypto.getRandomValues(buffer);
    return Array.from(buffer, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  const skuPath = () => encodeURIComponent(page.sku);
  /** The buyer in a body: the token names a signed-in buyer, so then no `user`. */
  const buyerBody = (fields) => (page.identity.bearer ? { ...fields } : { ...fields, user: page.identity.user });

  // --- calls ----------------------------------------------------------------------------

  /**
   * One call to this origin: status, parsed JSON (null when the body is not JSON), the
   * Retry-After seconds, and timings for the clock offset. Throws on a network failure or
   * timeout: the outcome is then unknown, and the caller retries what is safe to retry.
   */
  async function call(method, path, { body, headers = {}, bearer = true } = {}) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), CALL_TIMEOUT_MS);
    const sent = performance.now();
    const allHeaders = { Accept: "application/json", ...headers };
    if (body !== undefined) allHeaders["Content-Type"] = "application/json";
    if (bearer && page.identity.bearer) allHeaders.Authorization = "Bearer " + page.identity.bearer;
    try {
      const response = await fetch(path, {
        method,
        headers: allHeaders,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: "omit",
        cache: "no-store",
        signal: controller.signal,
      });
      const arrived = performance.now();
      const arrivedWallMs = Date.now();
      let json = null;
      try {
        json = await response.json();
      } catch (_) {
        json = null;
      }
      return {
        status: response.status,
        json,
        retryAfterS: retryAfter(response),
        roundTripMs: arrived - sent,
        arrivedWallMs,
      };
    } finally {
      clearTimeout(timer);
    }
  }

  function retryAfter(response) {
    const seconds = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    if (!Number.isFinite(seconds) || seconds < 0) return 1;
    return Math.min(Math.max(seconds, 1), RETRY_AFTER_MAX_S);
  }

  const errorText = (answer) => {
    const json = answer.json || {};
    if (json.message) return json.message + (json.error ? " (" + json.error + ")" : "");
    return "the shop answered " + answer.status;
  };

  const later = (seconds, step) => setTimeout(step, seconds * 1000);

  // --- the room: clock, countdown, line ----------------------------------------------------

  const serverNow = () => Date.now() + page.offsetMs;
  const started = () => page.synced && (page.startsAtMs === null || serverNow() >= page.startsAtMs);

  async function syncRoom() {
    // Until the first read succeeds the page can show nothing true, so it asks again soon;
    // after that a failed resync keeps the last offset and state, and says nothing.
    let next = ROOM_RESYNC_MS;
    try {
      const answer = await call("GET", "/v1/room/" + skuPath(), { bearer: false });
      if (answer.status === 200 && answer.json) {
        const room = answer.json;
        if (typeof room.server_ms === "number") {
          // The server read its clock about half a round trip before the answer arrived.
          if (!page.synced && view.result.classList.contains("bad")) showResult("", "");
          page.offsetMs = room.server_ms + answer.roundTripMs / 2 - answer.arrivedWallMs;
          page.synced = true;
        }
        applyRoom(room);
      } else if (answer.status === 404) {
        showResult("This sale does not exist: " + errorText(answer), "bad");
        view.countdown.textContent = "No such sale";
        return;
      } else if (!page.synced) {
        next = answer.retryAfterS * 1000;
        showResult("The sale's status is unavailable right now: " + errorText(answer), "bad");
      }
    } catch (_) {
      if (!page.synced) {
        next = ROOM_FIRST_RETRY_MS;
        showResult("Cannot reach the shop; retrying…", "bad");
      }
    } finally {
      tick();
    }
    scheduleSync(next);
  }

  /** One resync loop, whoever asks for an early read. */
  function scheduleSync(ms) {
    clearTimeout(page.syncTimer);
    page.syncTimer = setTimeout(syncRoom, ms);
  }

  function applyRoom(room) {
    page.startsAtMs = typeof room.starts_at_ms === "number" ? room.starts_at_ms : null;
    if (room.state === "ended") {
      endSale();
      return;
    }
    // A page in line hears sold out and reopening from its stream; the room read serves the
    // others.
    if (!page.waiter) {
      if (room.state === "sold_out") markSoldOut();
      else if (room.state === "open" && page.soldOut) reopen();
      if (!page.soldOut && !page.purchased && typeof room.line === "number") {
        view.position.textContent = room.line === 1 ? "1 buyer in line" : room.line + " buyers in line";
      }
    }
    if (!started() && room.state === "open" && !page.waiter) join();
    updateButton();
  }

  function tick() {
    if (page.saleState === "ended") {
      view.countdown.textContent = "The sale has ended";
    } else if (!page.synced) {
      view.countdown.textContent = "Syncing with the server clock…";
    } else if (!started()) {
      const seconds = Math.ceil((page.startsAtMs - serverNow()) / 1000);
      view.countdown.textContent = "Starts in " + clockText(seconds);
    } else {
      view.countdown.textContent = "On sale now";
    }
    // The start passed: what the room said before it reads differently now.
    if (started() && !page.startSeen) {
      page.startSeen = true;
      if (page.status) applyStatus(page.status);
    }
    updateButton();
    renderDeadline();
  }

  function clockText(totalSeconds) {
    const s = Math.max(0, totalSeconds);
    const two = (n) => String(n).padStart(2, "0");
    return two(Math.floor(s / 3600)) + ":" + two(Math.floor((s % 3600) / 60)) + ":" + two(s % 60);
  }

  async function join() {
    if (page.joining || page.waiter || !page.sku) return;
    page.joining = true;
    let retryInS = null;
    try {
      const answer = await call("POST", "/v1/room/" + skuPath() + "/join", { body: buyerBody({}) });
      if (answer.status === 200 && answer.json && answer.json.waiter) {
        page.joinTries = 0;
        page.waiter = answer.json.waiter;
        openStream();
        applyStatus(answer.json);
      } else if (answer.status === 429 || answer.status >= 500) {
        retryInS = answer.retryAfterS;
        view.position.textContent = "The line is busy; joining again in " + retryInS + " s…";
      } else {
        page.intent = false;
        showResult("Could not join the line: " + errorText(answer), "bad");
      }
    } catch (_) {
      retryInS = 1;
      view.position.textContent = "Cannot reach the shop; joining again…";
    } finally {
      page.joining = false;
      updateButton();
    }
    if (retryInS !== null) {
      page.joinTries += 1;
      if (page.joinTries <= RETRIES_MAX) later(retryInS, join);
      else showResult("Could not join the line; press Buy now to try again.", "bad");
    }
  }

  function openStream() {
    closeStream();
    const url = "/v1/room/" + skuPath() + "/events?waiter=" + encodeURIComponent(page.waiter);
    const stream = new EventSource(url);
    stream.addEventListener("status", (event) => {
      let status;
      try {
        status = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      applyStatus(status);
    });
    stream.onerror = () => {
      // A network failure reconnects by itself; CLOSED means the server refused the stream
      // (this waiter's handle expired, say): join again if the buyer still wants to buy.
      if (stream.readyState === EventSource.CLOSED && page.stream === stream) leftTheLine();
    };
    page.stream = stream;
  }

  /** The room no longer knows this waiter: a page that still wants to buy joins again. */
  function leftTheLine() {
    closeStream();
    page.waiter = null;
    page.status = null;
    if (!page.purchased && page.saleState !== "ended" && (page.intent || !started())) {
      page.joinTries += 1;
      if (page.joinTries <= RETRIES_MAX) later(1, join);
    }
  }

  function closeStream() {
    if (page.stream) {
      page.stream.close();
      page.stream = null;
    }
  }

  function applyStatus(status) {
    if (!status || typeof status !== "object") return;
    page.status = status;
    if (typeof status.waiter === "string" && status.waiter) page.waiter = status.waiter;
    if (typeof status.starts_at_ms === "number") page.startsAtMs = status.starts_at_ms;
    switch (status.state) {
      case "pre_queue":
        view.position.textContent =
          "You are in line. The line opens" + opensAt() + "; your place is drawn at random then.";
        break;
      case "waiting":
        reopen();
        view.position.textContent = waitingText(status);
        if (page.intent && !page.purchasing) showResult("Your order goes through when it is your turn.", "");
        break;
      case "admitted":
        // The admission this page already bought with, repeated (a stream's first message
        // replays the current status): nothing new, and no sign that units came back.
        if (status.ticket && status.ticket === page.spentTicket) break;
        reopen();
        // Never "your turn" under a closed button: before the start the ticket waits, and the
        // tick that sees the start shows this status again.
        if (!started()) {
          view.position.textContent = "You are at the head of the line.";
          showResult("The sale opens" + opensAt() + ": then press Buy now.", "");
          break;
        }
        view.position.textContent = "It is your turn.";
        if (page.intent && status.ticket) purchase(status.ticket);
        else if (!page.purchased) showResult("It is your turn: press Buy now" + ticketLeft(status) + ".", "good");
        break;
      case "sold_out":
        markSoldOut();
        break;
      case "ended":
        endSale();
        break;
      case "left":
        leftTheLine();
        break;
      default:
        break;
    }
    updateButton();
  }

  /** " at 10:00:00" (the start in the buyer's clock time), or "" before the clock is synced. */
  function opensAt() {
    if (page.startsAtMs === null || !page.synced) return "";
    const local = new Date(page.startsAtMs - page.offsetMs);
    return " at " + local.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function waitingText(status) {
    if (typeof status.position !== "number") return "You are in line.";
    let text = "Position " + status.position;
    if (typeof status.ahead === "number") text += " — about " + status.ahead + " ahead";
    if (typeof status.wait_s === "number") text += ", ~" + Math.max(1, Math.ceil(status.wait_s)) + " s";
    return text;
  }

  function ticketLeft(status) {
    if (typeof status.ticket_expires_at_ms !== "number") return "";
    const seconds = Math.ceil((status.ticket_expires_at_ms - serverNow()) / 1000);
    return seconds > 0 ? " within " + seconds + " s" : "";
  }

  function markSoldOut() {
    page.soldOut = true;
    page.saleState = "sold_out";
    if (!page.purchased) {
      view.position.textContent = page.waiter ? "You keep your place in case units come back." : "";
      showResult("Sold out", "bad");
    }
  }

  /** Units came back (unpaid orders expired): the line moves again for those still in it. */
  function reopen() {
    if (!page.soldOut) return;
    page.soldOut = false;
    page.saleState = "open";
    if (!page.purchased) showResult("Units came back: the line is moving again.", "good");
  }

  function endSale() {
    page.saleState = "ended";
    closeStream();
    if (!page.purchased) {
      view.position.textContent = "";
      showResult("The sale has ended", "bad");
    }
  }

  // --- buying ---------------------------------------------------------------------------

  function updateButton() {
    const pressable =
      started() &&
      !page.soldOut &&
      page.saleState !== "ended" &&
      !page.purchased &&
      !page.purchasing &&
      page.sku !== null &&
      performance.now() >= page.pressAllowedAt;
    view.buy.disabled = !pressable;
    let label = "Buy now";
    if (page.purchased) label = "Ordered";
    else if (page.saleState === "ended") label = "Sale ended";
    else if (page.soldOut) label = "Sold out";
    else if (page.purchasing) label = "Buying…";
    if (view.buy.textContent !== label) view.buy.textContent = label;
  }

  function press() {
    if (view.buy.disabled) return;
    page.pressAllowedAt = performance.now() + PRESS_GAP_MS;
    setTimeout(updateButton, PRESS_GAP_MS + 10);
    page.intent = true;
    const status = page.status;
    if (status && status.state === "admitted" && status.ticket && status.ticket !== page.spentTicket) {
      purchase(status.ticket);
    } else if (!page.waiter) {
      page.joinTries = 0;
      showResult("Joining the line…", "");
      join();
    } else {
      showResult("You are in line: your order goes through when it is your turn.", "");
    }
    updateButton();
  }

  function purchase(ticket) {
    if (page.purchasing || page.purchased || ticket === page.spentTicket) return;
    page.spentTicket = ticket;
    page.attempt = { key: randomHex(16), ticket, tries: 0 };
    sendPurchase();
  }

  async function sendPurchase() {
    const attempt = page.attempt;
    page.purchasing = true;
    updateButton();
    showResult("Placing your order…", "");
    let retryInS = null;
    try {
      const answer = await call("POST", "/v1/purchase", {
        body: buyerBody({ sku: page.sku, qty: 1 }),
        headers: { "Idempotency-Key": attempt.key, Ticket: attempt.ticket },
      });
      retryInS = settlePurchase(answer);
    } catch (_) {
      // The purchase may or may not have happened: the same key asks again and gets the
      // first answer.
      retryInS = 1;
    }
    if (retryInS !== null && attempt.tries < RETRIES_MAX) {
      attempt.tries += 1;
      showResult("Busy; trying again in " + retryInS + " s…", "");
      later(retryInS, sendPurchase);
      return;
    }
    if (retryInS !== null) showResult("The shop did not answer; press Buy now to try again.", "bad");
    page.purchasing = false;
    updateButton();
  }

  /** Applies a purchase answer; returns seconds to wait before retrying the same key, or null. */
  function settlePurchase(answer) {
    const json = answer.json || {};
    if (answer.status === 200 && json.result === "purchased") {
      page.purchased = true;
      page.intent = false;
      // Bought: leaving the stream leaves the line, so the next waiter moves up.
      closeStream();
      view.position.textContent = "";
      showResult("Order placed", "good");
      showOrder(String(json.order_id));
      return null;
    }
    if (answer.status === 409 && json.error === "in_progress") return 1;
    if (answer.status === 429 || answer.status === 503) return answer.retryAfterS;
    if (answer.status === 409 && json.error === "sold_out") {
      // Stay in line and keep the wish to buy: a reopened line admits this buyer again.
      markSoldOut();
      return null;
    }
    if (answer.status === 409 && json.error === "user_limit") {
      page.purchased = true;
      closeStream();
      showResult("You already bought as many as this sale allows.", "bad");
      return null;
    }
    if (answer.status === 403 && (json.error === "no_ticket" || json.error === "ticket_invalid")) {
      // The turn passed (the ticket expired or was spent): a press joins the line again.
      page.intent = false;
      page.waiter = null;
      page.status = null;
      closeStream();
      showResult("Your turn passed before the order went through. Press Buy now to join the line again.", "bad");
      return null;
    }
    if (answer.status === 403 && json.error === "ended") {
      endSale();
      return null;
    }
    if (answer.status === 403 && json.error === "not_started") scheduleSync(0);
    showResult("The order did not go through: " + errorText(answer), "bad");
    return null;
  }

  // --- the order and its payment ----------------------------------------------------------

  const STATE_TEXT = {
    pending_payment: "Waiting for payment",
    paid: "Paid",
    expired: "Expired: not paid in time",
    cancelled: "Cancelled",
    paid_after_expiry: "Paid too late: a refund is on its way",
  };

  function showOrder(id) {
    page.order = { id, data: null };
    page.orderPolls = 0;
    view.order.hidden = false;
    view.orderId.textContent = id;
    view.orderState.textContent = "Being recorded…";
    view.orderDeadline.textContent = "";
    restartOrderPoll();
  }

  function restartOrderPoll() {
    page.orderPolls = 0;
    page.orderPollLoop += 1;
    const loop = page.orderPollLoop;
    pollOrder(loop);
  }

  async function pollOrder(loop) {
    if (loop !== page.orderPollLoop) return;
    const order = page.order;
    let next = ORDER_FAST_POLL_MS;
    try {
      const answer = await call("GET", "/v1/orders/" + encodeURIComponent(order.id));
      if (answer.status === 200 && answer.json) {
        order.data = answer.json;
        renderOrder();
        if (order.data.state !== "pending_payment") return;
        if (!page.paying) next = ORDER_SLOW_POLL_MS;
      } else if (answer.status !== 404) {
        view.payStatus.textContent = "The order is unavailable right now: " + errorText(answer);
      }
    } catch (_) {
      // Asked again below.
    }
    // Fast polls while the order is being recorded or paid; they stop if it never settles.
    if (next === ORDER_FAST_POLL_MS) page.orderPolls += 1;
    if (page.orderPolls <= ORDER_FAST_POLLS_MAX) setTimeout(() => pollOrder(loop), next);
  }

  function renderOrder() {
    const data = page.order && page.order.data;
    if (!data) return;
    view.order.dataset.state = data.state;
    view.orderState.textContent = STATE_TEXT[data.state] || data.state;
    if (data.state === "paid") {
      page.paying = false;
      view.payStatus.textContent = "Paid. Thank you!";
      showResult("Order placed and paid", "good");
    }
    renderDeadline();
  }

  function renderDeadline() {
    const data = page.order && page.order.data;
    if (!data) return;
    const pending = data.state === "pending_payment";
    const leftS = Math.ceil((data.pay_deadline_ms - serverNow()) / 1000);
    if (!pending) {
      const paidAt = typeof data.paid_at_ms === "number" ? "paid at " + new Date(data.paid_at_ms).toLocaleTimeString() : "—";
      view.orderDeadline.textContent = paidAt;
    } else if (leftS > 0) {
      const at = new Date(data.pay_deadline_ms).toLocaleTimeString();
      view.orderDeadline.textContent = at + " (" + clockText(leftS) + " left)";
    } else {
      view.orderDeadline.textContent = "The deadline has passed";
    }
    view.pay.hidden = !(pending && leftS > 0);
    view.pay.disabled = page.paying;
  }

  async function pressPay() {
    if (page.paying || !page.order) return;
    page.paying = true;
    view.pay.disabled = true;
    view.payStatus.textContent = "Starting the payment…";
    await startPayment(0);
  }

  /** `POST /v1/orders/{id}/pay`: the order service opens (or answers again) the payment. */
  async function startPayment(tries) {
    const path = "/v1/orders/" + encodeURIComponent(page.order.id) + "/pay";
    let answer;
    try {
      answer = await call("POST", path, { body: buyerBody({}) });
    } catch (_) {
      // Pressing pay again answers the same payment, so a lost answer is safe to ask again.
      return retryPayment(tries, 1);
    }
    const json = answer.json || {};
    if (answer.status === 200) {
      if (typeof json.pay_deadline_ms === "number" && page.order.data) {
        page.order.data.pay_deadline_ms = json.pay_deadline_ms;
      }
      if (json.status === "succeeded") return awaitPaid();
      if (json.status === "failed") return payFailed("The payment was declined.");
      return payAtProvider(json.pay_url);
    }
    if (answer.status === 503 || answer.status === 429) return retryPayment(tries, answer.retryAfterS);
    return payFailed("The payment could not start: " + errorText(answer));
  }

  function retryPayment(tries, seconds) {
    if (tries >= RETRIES_MAX) return payFailed("The payment service did not answer; press Pay now again.");
    view.payStatus.textContent = "The payment service is busy; trying again in " + seconds + " s…";
    later(seconds, () => startPayment(tries + 1));
    return undefined;
  }

  /**
   * The buyer's step at the provider. The sandbox's `pay_url` is an API call (POST it with
   * the outcome) on its own address, which this page can only reach through its own origin:
   * the load balancer forwards `/v1/payments/{id}/pay` to it. A real provider's `pay_url` is
   * its checkout page, where the buyer goes.
   */
  async function payAtProvider(payUrl) {
    let url;
    try {
      url = new URL(payUrl, location.href);
    } catch (_) {
      return payFailed("The payment provider gave no place to pay.");
    }
    if (!/^\/v1\/payments\/[A-Za-z0-9_.:-]+\/pay$/.test(url.pathname)) {
      location.assign(url.href);
      return undefined;
    }
    view.payStatus.textContent = "Paying…";
    try {
      const answer = await call("POST", url.pathname, { body: { outcome: "succeed" }, bearer: false });
      const json = answer.json || {};
      if (answer.status === 200 && json.status === "failed") {
        return payFailed("The payment was declined" + (json.reason ? " (" + json.reason + ")" : "") + ".");
      }
      // 409 already_settled: an earlier press got through; the order tells how it ended.
      if (answer.status === 200 || (answer.status === 409 && json.error === "already_settled")) return awaitPaid();
      return payFailed("The payment did not go through: " + errorText(answer));
    } catch (_) {
      return payFailed("The payment provider did not answer; press Pay now again.");
    }
  }

  function awaitPaid() {
    view.payStatus.textContent = "Payment accepted; waiting for the shop to confirm…";
    // Read every second from now on (`paying`), until the order says paid.
    restartOrderPoll();
    return undefined;
  }

  function payFailed(text) {
    page.paying = false;
    view.payStatus.textContent = text;
    renderDeadline();
    return undefined;
  }

  // --- stock ----------------------------------------------------------------------------

  async function pollStock() {
    try {
      // The default cache mode: the page is public for a second and carries an ETag, so most
      // polls are answered by the browser or the load balancer.
      const response = await fetch("/v1/skus/" + skuPath(), { credentials: "omit" });
      if (response.status === 200) {
        const stock = await response.json();
        renderStock(stock);
        if (page.soldOut && !page.waiter && !stock.sold_out && !stock.closed) scheduleSync(0);
      } else if (response.status === 404) {
        view.stock.textContent = "Unknown item";
      }
    } catch (_) {
      // Shown stale until the next poll answers.
    }
    setTimeout(pollStock, STOCK_POLL_MS);
  }

  function renderStock(stock) {
    const out = Boolean(stock.closed || stock.sold_out);
    view.stock.classList.toggle("out", out);
    if (stock.closed) view.stock.textContent = "Sale closed";
    else if (stock.sold_out) view.stock.textContent = "Sold out";
    else view.stock.textContent = stock.remaining + " of " + stock.total + " left";
  }

  // --- wiring ---------------------------------------------------------------------------

  function showResult(text, kind) {
    // An unchanged text is not written again, so screen readers do not repeat it per push.
    if (view.result.textContent !== text) view.result.textContent = text;
    view.result.classList.toggle("good", kind === "good");
    view.result.classList.toggle("bad", kind === "bad");
  }

  function start() {
    view.buyer.textContent = page.identity.label;
    view.buy.addEventListener("click", press);
    view.pay.addEventListener("click", pressPay);
    if (page.sku === null) {
      view.title.textContent = "No sale here";
      view.countdown.textContent = "—";
      showResult("This page needs a sale's address, like /sale/phone.", "bad");
      return;
    }
    view.title.textContent = page.sku;
    document.title = page.sku + " — flash sale";
    // Closing the stream is leaving the line: a page that is gone must not hold a place.
    window.addEventListener("pagehide", closeStream);
    window.addEventListener("pageshow", (event) => {
      if (event.persisted && page.waiter && !page.purchased && page.saleState !== "ended") openStream();
    });
    setInterval(tick, TICK_MS);
    syncRoom();
    pollStock();
  }

  start();
})();
