// holdfast operator console: a live board of assets, holds and refunds.
//
// Plain script, no framework. Everything it shows comes from the JSON API of
// the same origin (the browser sends the credentials the person signed in
// with), polled at most once a second while the tab is visible. Every action
// goes through the same API and idempotency rules as any other client.
(() => {
  "use strict";

  const POLL_MS = 1000;
  const PAGE_SIZE = 50;
  const REFUND_PAGE = 500;
  const SOON_SECONDS = 60;
  const DEFAULT_STATUSES = ["AVAILABLE", "HELD", "SOLD", "WITHDRAWN"];
  const ASSET_PATH = "/v1/assets/{asset_id}";
  const WITHDRAW_PATH = "/v1/assets/{asset_id}/withdraw";
  const REINSTATE_PATH = "/v1/assets/{asset_id}/reinstate";
  const VOID_PATH = "/v1/reservations/{reservation_id}/void";
  const WAITLIST_PATH = "/v1/assets/{asset_id}/waitlist";
  const OFFER_PATH = "/v1/assets/{asset_id}/offers";
  const SEARCH_DELAY_MS = 300;
  const STATUS_WORDS = {
    AVAILABLE: "Available",
    HELD: "Held",
    SOLD: "Sold",
    WITHDRAWN: "Withdrawn",
  };
  const REASON_WORDS = {
    HOLD_EXPIRED: "paid after the hold lapsed",
    RESERVATION_RELEASED: "paid for a released hold",
    ALREADY_COMMITTED: "second payment for a sold asset",
    SALE_VOIDED: "sale voided",
    AMOUNT_MISMATCH: "paid less than the price, or another currency",
  };

  const $ = (id) => document.getElementById(id);
  const reducedMotion = window.matchMedia("(prefers-reduced-motion: reduce)");

  const state = {
    doc: null, // the OpenAPI document, read once
    statuses: DEFAULT_STATUSES.slice(),
    filter: "", // status shown on the board; "" for all
    prefix: "", // the id prefix the board lists; "" for every id
    pageCursors: [null], // the cursor that opens each page seen so far
    page: 0,
    nextCursor: null,
    assets: [],
    view: 0, // bumped when the board's query changes; stale answers are dropped
    buyers: new Map(), // reservation id -> buyer id (null when unknown)
    selected: null, // asset id whose timeline is open
    selectedAsset: null,
    refundFilter: "REQUESTED",
    canWithdraw: false,
    canReinstate: false,
    canSetOpening: false,
    canVoid: false,
    canQueue: false,
    canOffer: false,
    paused: false,
    signedOut: false,
    timer: 0,
    lastTick: 0,
    failures: 0,
    lastUpdate: null,
    submissions: new Map(), // form -> {fingerprint, key, unanswered}
  };

  // ---- the server's clock ------------------------------------------------
  // Holds end on the database's clock. Each answer's Date header (whole
  // seconds) bounds the offset between that clock and this browser's; the
  // bounds from all answers are intersected. Countdowns trust this browser's
  // clock unless the bounds prove it wrong, and then correct it just enough.
  const clock = { lo: -Infinity, hi: Infinity };

  function observeDate(response, sentAt, receivedAt) {
    const date = Date.parse(response.headers.get("Date") || "");
    if (Number.isNaN(date)) return;
    let lo = date - receivedAt;
    let hi = date + 1000 - sentAt;
    if (Math.max(lo, clock.lo) <= Math.min(hi, clock.hi)) {
      lo = Math.max(lo, clock.lo);
      hi = Math.min(hi, clock.hi);
    }
    clock.lo = lo;
    clock.hi = hi;
  }

  function serverNow() {
    const offset = Number.isFinite(clock.lo) ? Math.min(Math.max(0, clock.lo), clock.hi) : 0;
    return Date.now() + offset;
  }

  // ---- the API -------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem) {
      super(describeProblem(status, problem));
      this.status = status;
      this.problem = problem || {};
    }
  }

  class NoAnswer extends Error {}

  /** No answer, or a 5xx: the request may have acted (a retry with its key replays). */
  function mayHaveActed(error) {
    return error instanceof NoAnswer || (error instanceof ApiError && error.status >= 500);
  }

  /** One request to the API of this origin; resolves to the parsed body. */
  async function api(method, path, options = {}) {
    const headers = { Accept: "application/json, application/problem+json" };
    let body;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    if (options.idempotencyKey) headers["Idempotency-Key"] = options.idempotencyKey;
    const sentAt = Date.now();
    let response;
    try {
      response = await fetch(path, { method, headers, body, credentials: "same-origin", cache: "no-store" });
    } catch (error) {
      throw new NoAnswer(`No answer from the server (${error.message}).`);
    }
    observeDate(response, sentAt, Date.now());
    const type = response.headers.get("Content-Type") || "";
    let parsed = null;
    if (type.includes("json")) {
      try {
        parsed = await response.json();
      } catch {
        parsed = null;
      }
    }
    if (!response.ok) {
      if (response.status === 401) signedOut();
      throw new ApiError(response.status, parsed);
    }
    return parsed;
  }

  /** "Conflict: Asset is currently reserved…", from an RFC 9457 problem. */
  function describeProblem(status, problem) {
    if (!problem || typeof problem !== "object") return `The server answered ${status}.`;
    const title = problem.title || `Error ${status}`;
    const detail = problem.detail || problem.message || "";
    let text = detail ? `${title}: ${detail}` : title;
    if (Array.isArray(problem.errors) && problem.errors.length > 0) {
      text += ` (${problem.errors.map((e) => `${e.field}: ${e.message}`).join("; ")})`;
    }
    return text;
  }

  /** Whether the document says this operation takes an Idempotency-Key. */
  function takesIdempotencyKey(method, template) {
    const operation = state.doc?.paths?.[template]?.[method.toLowerCase()];
    return (operation?.parameters || []).some((p) => p.in === "header" && /^idempotency-key$/i.test(p.name || ""));
  }

  function hasOperation(method, template) {
    return Boolean(state.doc?.paths?.[template]?.[method.toLowerCase()]);
  }

  function newKey() {
    if (window.crypto?.randomUUID) return window.crypto.randomUUID();
    // Outside a secure context randomUUID is missing; build a v4 UUID.
    const b = window.crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  /**
   * An action through the API. When the operation takes an Idempotency-Key,
   * a retry of the same submission (same action, same values) after an
   * unanswered attempt reuses its key, so it cannot act twice.
   */
  async function act(name, method, template, params, body) {
    const path = template.replace(/\{(\w+)\}/g, (_, k) => encodeURIComponent(params[k]));
    const fingerprint = JSON.stringify([method, path, body ?? null]);
    let key;
    if (takesIdempotencyKey(method, template)) {
      const previous = state.submissions.get(name);
      key = previous && previous.fingerprint === fingerprint && previous.unanswered ? previous.key : newKey();
    }
    const submission = { fingerprint, key, unanswered: true };
    state.submissions.set(name, submission);
    try {
      const result = await api(method, path, { body, idempotencyKey: key });
      submission.unanswered = false;
      return result;
    } catch (error) {
      // Only a lost answer or a 5xx may have acted; after any other answer a
      // retry is a new request.
      submission.unanswered = mayHaveActed(error);
      throw error;
    }
  }

  // ---- messages --------------------------------------------------------------

  let noticeTimer = 0;

  function notify(text) {
    const el = $("notice");
    el.textContent = text;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => {
      el.textContent = "";
    }, 8000);
  }

  function alertError(text) {
    const el = $("alert");
    el.replaceChildren();
    if (!text) return;
    const p = document.createElement("p");
    p.textContent = text;
    const dismiss = button("Dismiss", "secondary small", () => {
      el.replaceChildren();
    });
    el.append(p, dismiss);
  }

  function failure(error) {
    return error instanceof Error ? error.message : String(error);
  }

  function setLive(kind, text) {
    const el = $("live-state");
    el.dataset.state = kind;
    el.textContent = text;
  }

  function signedOut() {
    if (state.signedOut) return;
    state.signedOut = true;
    stopPolling();
    setLive("error", "Not signed in");
    alertError("The server no longer accepts this page's credentials (401). Reload the page to sign in with an admin API key.");
  }

  // ---- small DOM helpers -------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function button(text, className, onClick) {
    const b = el("button", className, text);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function statusWord(status) {
    return STATUS_WORDS[status] || status.charAt(0) + status.slice(1).toLowerCase();
  }

  function badge(status) {
    const span = el("span", `badge badge-${status.toLowerCase()}`, status);
    return span;
  }

  function localTime(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const today = new Date().toDateString() === d.toDateString();
    return today
      ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })
      : d.toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
  }

  function timeEl(iso, className) {
    const t = el("time", className, localTime(iso));
    t.dateTime = iso;
    t.title = iso;
    return t;
  }

  /** 4:05, or 1:02:03 for an hour and more. */
  function formatRemaining(ms) {
    const total = Math.ceil(ms / 1000);
    const h = Math.floor(total / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = String(total % 60).padStart(2, "0");
    return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${s}` : `${m}:${s}`;
  }

  function countdown(expiresAt) {
    const t = el("time", "countdown");
    t.dateTime = expiresAt;
    t.dataset.expires = String(Date.parse(expiresAt));
    t.title = `Hold ends at ${localTime(expiresAt)}`;
    paintCountdown(t);
    return t;
  }

  function paintCountdown(t) {
    const left = Number(t.dataset.expires) - serverNow();
    if (left > 0) {
      setText(t, formatRemaining(left));
      t.classList.toggle("soon", left <= SOON_SECONDS * 1000);
      t.classList.remove("lapsed");
    } else {
      setText(t, "lapsed");
      t.classList.add("lapsed");
    }
  }

  function tickCountdowns() {
    for (const t of document.querySelectorAll("time.countdown")) paintCountdown(t);
    for (const t of document.querySelectorAll("time.opens")) paintOpens(t);
  }

  // ---- when a sale opens ---------------------------------------------------------

  const DAY_MS = 24 * 3600 * 1000;

  /** Whether the asset's sale opens later (holds answer 409 SALE_NOT_OPEN until then). */
  function opensLater(asset) {
    const at = Date.parse(asset?.available_from || "");
    return !Number.isNaN(at) && at > serverNow();
  }

  /** "opens in 2 h 05 min" within a day, else "opens 1 Dec 2026, 09:00"; gone once open. */
  function opensNote(iso) {
    const t = el("time", "opens");
    t.dateTime = iso;
    t.dataset.opens = String(Date.parse(iso));
    t.title = `The sale opens at ${localTime(iso)}`;
    paintOpens(t);
    return t;
  }

  function paintOpens(t) {
    const left = Number(t.dataset.opens) - serverNow();
    t.hidden = !(left > 0);
    if (t.hidden) return;
    if (left >= DAY_MS) {
      setText(t, `opens ${localTime(t.dateTime)}`);
      return;
    }
    const total = Math.ceil(left / 1000);
    const h = Math.floor(total / 3600);
    const m = Math.floor((total % 3600) / 60);
    let text;
    if (h > 0) text = `${h} h ${String(m).padStart(2, "0")} min`;
    else if (total >= 60) text = `${Math.ceil(total / 60)} min`;
    else text = `${total} s`;
    setText(t, `opens in ${text}`);
  }

  /** "2026-12-01T09:00" in this browser's time zone, for a datetime-local input. */
  function localInputValue(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const p = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
  }

  // ---- counts ------------------------------------------------------------------

  async function loadCounts() {
    const body = await api("GET", "/v1/asset-counts");
    const counts = body?.counts || {};
    for (const status of Object.keys(counts)) {
      if (!state.statuses.includes(status)) {
        state.statuses.push(status);
        renderStatusOptions();
      }
    }
    let total = 0;
    for (const status of state.statuses) total += counts[status] || 0;
    for (const item of $("counts").querySelectorAll("button[data-status]")) {
      const status = item.dataset.status;
      const n = status === "" ? total : counts[status] || 0;
      setText(item.querySelector(".count-n"), String(n));
    }
  }

  function renderCounts() {
    const list = $("counts");
    list.replaceChildren();
    for (const status of ["", ...state.statuses]) {
      const li = el("li");
      const b = button("", `count count-${(status || "all").toLowerCase()}`, () => setFilter(status));
      b.dataset.status = status;
      b.setAttribute("aria-pressed", String(state.filter === status));
      b.append(el("span", "count-n", "–"), el("span", "count-label", status ? statusWord(status) : "All"));
      li.append(b);
      list.append(li);
    }
  }

  // ---- the board -------------------------------------------------------------

  function renderStatusOptions() {
    const box = $("status-options");
    box.replaceChildren();
    for (const status of ["", ...state.statuses]) {
      const id = `status-${status || "all"}`;
      const input = el("input");
      input.type = "radio";
      input.name = "status";
      input.id = id;
      input.value = status;
      input.checked = state.filter === status;
      input.addEventListener("change", () => setFilter(status));
      const label = el("label", "chip", status ? statusWord(status) : "All");
      label.htmlFor = id;
      box.append(input, label);
    }
    renderCounts();
  }

  function setFilter(status) {
    if (state.filter === status) return;
    state.filter = status;
    for (const input of document.querySelectorAll('input[name="status"]')) input.checked = input.value === status;
    for (const b of $("counts").querySelectorAll("button[data-status]")) {
      b.setAttribute("aria-pressed", String(b.dataset.status === status));
    }
    state.pageCursors = [null];
    state.page = 0;
    refreshBoard();
  }

  function refreshBoard() {
    state.view += 1;
    loadAssets().catch(reportLoadError);
  }

  async function loadAssets() {
    const view = state.view;
    const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (state.filter) params.set("status", state.filter);
    if (state.prefix) params.set("id_prefix", state.prefix);
    const cursor = state.pageCursors[state.page];
    if (cursor) params.set("cursor", cursor);
    const body = await api("GET", `/v1/assets?${params}`);
    if (view !== state.view) return; // the operator asked for something else meanwhile
    state.assets = body?.items || [];
    state.nextCursor = body?.next_cursor || null;
    renderBoard();
    lookUpBuyers(state.assets);
  }

  /** Buyers are on reservations; each reservation is read once. */
  function lookUpBuyers(assets) {
    for (const asset of assets) {
      const rid = asset.current_reservation_id;
      if (!rid || state.buyers.has(rid)) continue;
      state.buyers.set(rid, undefined);
      api("GET", `/v1/reservations/${encodeURIComponent(rid)}`)
        .then((r) => {
          state.buyers.set(rid, r?.buyer_id ?? null);
          paintBuyers();
        })
        .catch(() => {
          state.buyers.delete(rid); // try again on a later update
        });
    }
    if (state.buyers.size > 2000) {
      const keep = new Set(assets.map((a) => a.current_reservation_id));
      for (const rid of state.buyers.keys()) if (!keep.has(rid)) state.buyers.delete(rid);
    }
  }

  function buyerOf(asset) {
    const rid = asset.current_reservation_id;
    if (!rid) return "—";
    const buyer = state.buyers.get(rid);
    return buyer === undefined ? "…" : buyer ?? "—";
  }

  function paintBuyers() {
    for (const row of $("asset-rows").children) {
      const asset = row._asset;
      if (asset) setText(row.querySelector(".cell-buyer .value"), buyerOf(asset));
    }
    if (state.selectedAsset) {
      const cell = document.querySelector("#asset-detail .detail-buyer");
      if (cell) setText(cell, buyerOf(state.selectedAsset));
    }
  }

  /** The board lists the ids that start with what is typed, once typing pauses. */
  let searchTimer = 0;
  function onSearchInput() {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      const prefix = $("search").value.trim();
      if (prefix === state.prefix) return;
      state.prefix = prefix;
      state.pageCursors = [null];
      state.page = 0;
      refreshBoard();
    }, SEARCH_DELAY_MS);
  }

  // ISO 4217's minor units where they are not two (the API's amounts are in
  // them; a browser's own currency data may round some to whole units).
  const MINOR_UNITS = {
    BIF: 0, CLP: 0, DJF: 0, GNF: 0, ISK: 0, JPY: 0, KMF: 0, KRW: 0, PYG: 0, RWF: 0,
    UGX: 0, UYI: 0, VND: 0, VUV: 0, XAF: 0, XOF: 0, XPF: 0,
    BHD: 3, IQD: 3, JOD: 3, KWD: 3, LYD: 3, OMR: 3, TND: 3, CLF: 4, UYW: 4,
  };

  /** "IDR 15,000,000.00" or "€2,500.00": an amount in minor units, in its currency. */
  function formatPrice(price) {
    if (!price) return "—";
    const digits = MINOR_UNITS[price.currency] ?? 2;
    try {
      const format = new Intl.NumberFormat(undefined, {
        style: "currency",
        currency: price.currency,
        minimumFractionDigits: digits,
        maximumFractionDigits: digits,
      });
      return format.format(price.amount / 10 ** digits);
    } catch {
      return `${price.amount} ${price.currency} (minor units)`;
    }
  }

  /** "region: AB · digits: 2 · premium": what the shop filters on. */
  function describeAttributes(attributes) {
    return Object.entries(attributes || {})
      .map(([key, value]) => (value === true ? key : value === false ? `not ${key}` : `${key}: ${value}`))
      .join(" · ");
  }

  function waitingNote(asset) {
    const n = asset.waitlist_length || 0;
    return n > 0 ? el("span", "waiting", `${n} waiting`) : null;
  }

  const COLUMNS = ["Asset", "Name", "Price", "Status", "Hold ends in", "Buyer", "Updated", "Actions"];

  function newRow(asset) {
    const tr = el("tr");
    tr.setAttribute("role", "row");
    tr.dataset.id = asset.id;
    const th = el("th");
    th.scope = "row";
    th.setAttribute("role", "rowheader");
    th.className = "cell-id";
    const open = button(asset.id, "asset-link", () => openTimeline(asset.id, open));
    open.setAttribute("aria-controls", "timeline");
    open.setAttribute("aria-expanded", "false");
    open.setAttribute("aria-label", `${asset.id}: show timeline`);
    th.append(open);
    tr.append(th);
    for (const [i, name] of ["name", "price", "status", "hold", "buyer", "updated", "actions"].entries()) {
      const td = el("td", `cell-${name}`);
      td.setAttribute("role", "cell");
      td.dataset.label = COLUMNS[i + 1];
      td.append(el("span", "value"));
      tr.append(td);
    }
    return tr;
  }

  function paintRow(tr, asset) {
    const previous = tr._asset;
    tr._asset = asset;
    tr.dataset.status = asset.status;
    const attributes = describeAttributes(asset.attributes);
    const nameCell = tr.querySelector(".cell-name .value");
    if (!previous || previous.name !== asset.name || describeAttributes(previous.attributes) !== attributes) {
      nameCell.replaceChildren(el("span", "asset-name", asset.name));
      if (attributes) nameCell.append(el("span", "attrs", attributes));
    }
    setText(tr.querySelector(".cell-price .value"), formatPrice(asset.price));
    const statusCell = tr.querySelector(".cell-status .value");
    if (
      !previous ||
      previous.status !== asset.status ||
      previous.available_from !== asset.available_from ||
      previous.waitlist_length !== asset.waitlist_length
    ) {
      statusCell.replaceChildren(badge(asset.status));
      if (asset.available_from && opensLater(asset)) statusCell.append(" ", opensNote(asset.available_from));
      const waiting = waitingNote(asset);
      if (waiting) statusCell.append(" ", waiting);
      if (previous && previous.status !== asset.status) flash(tr);
    }
    const holdCell = tr.querySelector(".cell-hold .value");
    if (!previous || previous.hold_expires_at !== asset.hold_expires_at || previous.status !== asset.status) {
      holdCell.replaceChildren(asset.status === "HELD" && asset.hold_expires_at ? countdown(asset.hold_expires_at) : el("span", "none", "—"));
    }
    setText(tr.querySelector(".cell-buyer .value"), buyerOf(asset));
    if (!previous || previous.updated_at !== asset.updated_at) {
      tr.querySelector(".cell-updated .value").replaceChildren(timeEl(asset.updated_at));
    }
    if (!previous || previous.status !== asset.status) {
      tr.querySelector(".cell-actions .value").replaceChildren(...actionButtons(asset));
    }
    const open = tr.querySelector(".asset-link");
    const selected = state.selected === asset.id;
    open.setAttribute("aria-expanded", String(selected));
    tr.classList.toggle("selected", selected);
  }

  function flash(tr) {
    tr.classList.remove("changed");
    void tr.offsetWidth; // restart the highlight
    tr.classList.add("changed");
  }

  const rows = new Map(); // asset id -> <tr>

  function renderBoard() {
    const body = $("asset-rows");
    const seen = new Set();
    let position = 0;
    for (const asset of state.assets) {
      seen.add(asset.id);
      let tr = rows.get(asset.id);
      if (!tr) {
        tr = newRow(asset);
        rows.set(asset.id, tr);
      }
      paintRow(tr, asset);
      // Move a row only when it is out of place, so focus is kept.
      if (body.children[position] !== tr) body.insertBefore(tr, body.children[position] || null);
      position += 1;
    }
    for (const [id, tr] of rows) {
      if (!seen.has(id)) {
        tr.remove();
        rows.delete(id);
      }
    }
    const shown = state.assets.length;
    $("assets-empty").hidden = shown > 0;
    $("assets-empty").textContent = state.prefix ? `No asset id starts with “${state.prefix}”.` : "No assets match.";
    const what = state.filter ? `${statusWord(state.filter)} assets` : "All assets";
    const q = state.prefix;
    setText($("assets-caption"), `${what}, page ${state.page + 1}${q ? `, ids starting with “${q}”` : ""}: ${shown} shown`);
    setText($("page-number"), `Page ${state.page + 1}`);
    $("prev-page").disabled = state.page === 0;
    $("next-page").disabled = !state.nextCursor;
    $("pager").hidden = state.page === 0 && !state.nextCursor;
    $("assets").classList.toggle("no-actions", !(state.canWithdraw || state.canReinstate));
  }

  /** The row's actions; the timeline adds voiding a sale. */
  function actionButtons(asset, inTimeline = false) {
    const buttons = [];
    if (state.canWithdraw && (asset.status === "AVAILABLE" || asset.status === "HELD")) {
      const b = button("Withdraw", "secondary small", () => withdraw(asset.id, b));
      b.setAttribute("aria-label", `Withdraw ${asset.id}`);
      buttons.push(b);
    }
    if (state.canReinstate && asset.status === "WITHDRAWN") {
      const b = button("Reinstate", "secondary small", () => reinstate(asset.id, b));
      b.setAttribute("aria-label", `Reinstate ${asset.id}`);
      buttons.push(b);
    }
    if (inTimeline && state.canVoid && asset.status === "SOLD" && asset.current_reservation_id) {
      const b = button("Void sale", "secondary small danger", () => voidSale(asset, b));
      b.setAttribute("aria-label", `Void the sale of ${asset.id}`);
      buttons.push(b);
    }
    return buttons;
  }

  // ---- admin actions ---------------------------------------------------------

  /** The asset as this page last saw it. */
  function shownAsset(assetId) {
    return state.assets.find((a) => a.id === assetId) || (state.selectedAsset?.id === assetId ? state.selectedAsset : null);
  }

  function knownBuyer(asset) {
    const buyer = asset ? buyerOf(asset) : "—";
    return buyer === "—" || buyer === "…" ? null : buyer;
  }

  /** The error code of an API problem, or "". */
  function problemCode(error) {
    return error instanceof ApiError ? error.problem.error_code || "" : "";
  }

  /**
   * Withdraw an asset. A held one is withdrawn only after the operator
   * confirms, with {"force": true}: the hold's reservation is RELEASED.
   */
  async function withdraw(assetId, trigger) {
    const asset = shownAsset(assetId);
    let body = {};
    const buyer = knownBuyer(asset);
    if (asset?.status === "HELD") {
      const who = buyer ? ` by ${buyer}` : "";
      const question = `${assetId} is held${who}. Withdraw it anyway? The hold ends now (its reservation is released; a payment that still comes is refunded).`;
      if (!window.confirm(question)) return;
      body = { force: true };
    }
    await runAction(trigger, async () => {
      let result;
      try {
        result = await act(`withdraw:${assetId}`, "POST", WITHDRAW_PATH, { asset_id: assetId }, body);
      } catch (error) {
        const code = problemCode(error);
        if (code === "ASSET_HELD") {
          throw new Error(`${assetId} was not withdrawn: a buyer holds it now (409 ASSET_HELD). Press Withdraw again to end that hold and withdraw it.`);
        }
        if (code === "ASSET_SOLD") {
          throw new Error(`${assetId} was not withdrawn: it is sold (409 ASSET_SOLD). To put it back on sale, void the sale from its timeline.`);
        }
        throw error;
      }
      const released = body.force ? `; the hold${buyer ? ` of ${buyer}` : ""} was released` : "";
      notify(`${assetId} is ${result?.status || "WITHDRAWN"}${released}.`);
    });
  }

  async function reinstate(assetId, trigger) {
    await runAction(trigger, async () => {
      const result = await act(`reinstate:${assetId}`, "POST", REINSTATE_PATH, { asset_id: assetId }, {});
      notify(`${assetId} is ${result?.status || "AVAILABLE"} again.`);
    });
  }

  /**
   * Void a sale (after confirming): the reservation becomes VOIDED, the
   * asset AVAILABLE, and the payment is refunded. A retry of the same click
   * after no answer sends the same Idempotency-Key, so it cannot act twice.
   */
  async function voidSale(asset, trigger) {
    const rid = asset.current_reservation_id;
    const buyer = knownBuyer(asset);
    const question = `Void the sale of ${asset.id}${buyer ? ` to ${buyer}` : ""}? It becomes AVAILABLE again and the payment is refunded (a SALE_VOIDED refund to pay back).`;
    if (!window.confirm(question)) return;
    await runAction(trigger, async () => {
      let result;
      try {
        result = await act(`void:${rid}`, "POST", VOID_PATH, { reservation_id: rid }, {});
      } catch (error) {
        if (mayHaveActed(error)) throw new Error(`${error.message} Press Void sale again to retry: the same request is sent, so the sale is voided once.`);
        if (problemCode(error) === "RESERVATION_NOT_ACTIVE") {
          throw new Error(`The sale of ${asset.id} was not voided: its reservation is ${error.problem.reservation?.status || "no longer committed"} (409 RESERVATION_NOT_ACTIVE).`);
        }
        throw error;
      }
      const refunded = (result?.refunds || []).some((r) => r.reason === "SALE_VOIDED");
      notify(`The sale of ${asset.id} is ${result?.status || "VOIDED"}; the asset is on sale again${refunded ? " and the payment waits to be refunded" : ""}.`);
    });
  }

  /** Set when the sale of the asset in the timeline opens, or open it now. */
  async function setOpening(openNow, trigger) {
    const asset = state.selectedAsset;
    if (!asset) return;
    let availableFrom = null;
    if (!openNow) {
      const value = $("opening-at").value;
      const at = value ? new Date(value) : null;
      if (!at || Number.isNaN(at.getTime())) {
        alertError("Choose the date and time the sale opens, or press Open now.");
        $("opening-at").focus();
        return;
      }
      availableFrom = at.toISOString();
    }
    await runAction(trigger, async () => {
      const result = await act(`opening:${asset.id}`, "PATCH", ASSET_PATH, { asset_id: asset.id }, { available_from: availableFrom });
      const opens = result?.available_from;
      $("opening-at").value = opens ? localInputValue(opens) : "";
      notify(opens && opensLater(result) ? `${asset.id}: the sale opens at ${localTime(opens)}.` : `${asset.id}: the sale is open.`);
    });
  }

  /** Runs an action, then shows the board as it now is (also after a refusal: the page may have been stale). */
  async function runAction(trigger, work) {
    if (trigger) trigger.disabled = true;
    alertError("");
    try {
      await work();
    } catch (error) {
      alertError(failure(error));
    } finally {
      if (trigger && trigger.isConnected) trigger.disabled = false;
      refreshBoard();
      loadCounts().catch(() => {});
      if (state.selected) loadTimeline().catch(() => {});
    }
  }

  async function createAsset(event) {
    event.preventDefault();
    const form = event.currentTarget;
    const id = form.elements.id.value.trim();
    const name = form.elements.name.value.trim();
    const submit = $("create-submit");
    const previous = state.submissions.get("create");
    const retried = Boolean(previous?.unanswered) && previous.fingerprint === JSON.stringify(["POST", "/v1/assets", { id, name }]);
    await runAction(submit, async () => {
      try {
        const asset = await act("create", "POST", "/v1/assets", {}, { id, name });
        notify(`Created ${asset?.id || id}.`);
      } catch (error) {
        // The unanswered first try may have created it: the same asset is success.
        if (retried && error instanceof ApiError && error.problem.error_code === "ASSET_EXISTS") {
          const existing = await api("GET", `/v1/assets/${encodeURIComponent(id)}`).catch(() => null);
          if (existing?.name === name) {
            notify(`Created ${id}.`);
            return;
          }
        }
        if (mayHaveActed(error)) throw new Error(`${error.message} Press Create asset again to retry.`);
        throw error;
      }
      form.reset();
      form.elements.id.focus();
    });
  }

  // ---- search ------------------------------------------------------------------

  async function findAsset(event) {
    event.preventDefault();
    const id = $("search").value.trim();
    if (!id) return;
    alertError("");
    try {
      const asset = await api("GET", `/v1/assets/${encodeURIComponent(id)}`);
      showTimeline(asset.id, null);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) alertError(`No asset has the id “${id}”.`);
      else alertError(failure(error));
    }
  }

  // ---- the timeline ----------------------------------------------------------

  let timelineOpener = null;

  function openTimeline(assetId, opener) {
    if (state.selected === assetId && !$("timeline").hidden) {
      closeTimeline();
      return;
    }
    showTimeline(assetId, opener);
  }

  function showTimeline(assetId, opener) {
    state.selected = assetId;
    state.selectedAsset = null;
    timelineOpener = opener || null;
    const panel = $("timeline");
    panel.hidden = false;
    setText($("timeline-heading"), `Timeline of ${assetId}`);
    $("asset-detail").replaceChildren();
    $("detail-actions").replaceChildren();
    $("opening-form").hidden = true;
    $("offer-form").hidden = true;
    $("offer-form").reset();
    $("queue-section").hidden = true;
    $("queue").replaceChildren();
    $("queue").dataset.signature = "";
    $("events").replaceChildren();
    $("events-empty").hidden = true;
    for (const tr of rows.values()) {
      const selected = tr.dataset.id === assetId;
      tr.classList.toggle("selected", selected);
      tr.querySelector(".asset-link").setAttribute("aria-expanded", String(selected));
    }
    panel.focus({ preventScroll: true });
    panel.scrollIntoView({ block: "nearest", behavior: reducedMotion.matches ? "auto" : "smooth" });
    loadTimeline().catch(reportLoadError);
  }

  function closeTimeline() {
    state.selected = null;
    state.selectedAsset = null;
    $("timeline").hidden = true;
    for (const tr of rows.values()) {
      tr.classList.remove("selected");
      tr.querySelector(".asset-link").setAttribute("aria-expanded", "false");
    }
    const back = timelineOpener && timelineOpener.isConnected ? timelineOpener : $("board");
    timelineOpener = null;
    back.focus();
  }

  async function loadTimeline() {
    const id = state.selected;
    if (!id) return;
    const path = `/v1/assets/${encodeURIComponent(id)}`;
    let asset;
    let events;
    try {
      [asset, events] = await Promise.all([api("GET", path), allEvents(path)]);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404 && state.selected === id) {
        alertError(`No asset has the id “${id}”.`);
        closeTimeline();
        return;
      }
      throw error;
    }
    if (state.selected !== id) return;
    const changed = !state.selectedAsset || state.selectedAsset.version !== asset.version || state.selectedAsset.status !== asset.status;
    state.selectedAsset = asset;
    if (changed || $("asset-detail").childElementCount === 0) renderDetail(asset);
    lookUpBuyers([asset]);
    renderEvents(events);
    await loadQueue(id);
  }

  /** Every event of an asset, oldest first, following next_cursor page by page. */
  async function allEvents(path) {
    const items = [];
    let cursor = null;
    do {
      const query = cursor ? `?cursor=${encodeURIComponent(cursor)}` : "";
      const page = await api("GET", `${path}/events${query}`);
      items.push(...(page?.items || []));
      cursor = page?.next_cursor || null;
    } while (cursor);
    return items;
  }

  function renderDetail(asset) {
    const dl = $("asset-detail");
    const entries = [
      ["Name", el("span", null, asset.name)],
      ["Price", el("span", null, formatPrice(asset.price))],
      ["Attributes", el("span", null, describeAttributes(asset.attributes) || "—")],
      ["Status", badge(asset.status)],
      ["Waiting", el("span", null, String(asset.waitlist_length || 0))],
      ["Hold ends in", asset.status === "HELD" && asset.hold_expires_at ? countdown(asset.hold_expires_at) : el("span", null, "—")],
      ["Sale opens", openingDetail(asset)],
      ["Buyer", el("span", "detail-buyer", buyerOf(asset))],
      ["Reservation", el("code", null, asset.current_reservation_id || "—")],
      ["Version", el("span", null, String(asset.version))],
      ["Created", timeEl(asset.created_at)],
    ];
    dl.replaceChildren();
    for (const [term, value] of entries) {
      const div = el("div");
      div.append(el("dt", null, term));
      const dd = el("dd");
      dd.append(value);
      div.append(dd);
      dl.append(div);
    }
    $("detail-actions").replaceChildren(...actionButtons(asset, true));
    const form = $("opening-form");
    const wasHidden = form.hidden;
    form.hidden = !state.canSetOpening || asset.status === "SOLD";
    $("opening-now").hidden = !opensLater(asset);
    // Filled when the form appears, never while the operator may be typing.
    if (wasHidden && !form.hidden) $("opening-at").value = asset.available_from ? localInputValue(asset.available_from) : "";
    const offer = $("offer-form");
    const offerHidden = offer.hidden;
    offer.hidden = !state.canOffer || asset.status !== "AVAILABLE";
    if (offerHidden && !offer.hidden && !$("offer-until").value) {
      $("offer-until").value = localInputValue(new Date(serverNow() + 2 * 24 * 3600 * 1000).toISOString());
    }
  }

  /** The asset's waiting list, first first, as an admin reads it. */
  async function loadQueue(assetId) {
    if (!state.canQueue) return;
    const body = await api("GET", WAITLIST_PATH.replace("{asset_id}", encodeURIComponent(assetId)));
    if (state.selected !== assetId) return;
    renderQueue(body?.items || []);
  }

  function renderQueue(items) {
    $("queue-section").hidden = false;
    const list = $("queue");
    const signature = JSON.stringify(items.map((e) => [e.position, e.buyer_id, e.client]));
    if (list.dataset.signature === signature) return;
    list.dataset.signature = signature;
    list.replaceChildren();
    for (const entry of items) {
      const li = el("li", "queue-entry");
      li.dataset.buyer = entry.buyer_id;
      li.append(
        el("span", "queue-position", `${entry.position}.`),
        " ",
        el("span", "queue-buyer", entry.buyer_id),
        el("span", "queue-client", ` (${entry.client}), waiting since `),
        timeEl(entry.joined_at),
      );
      list.append(li);
    }
    $("queue-empty").hidden = items.length > 0;
  }

  /**
   * Offer the asset in the timeline to a named buyer, held until a date for
   * the storefront that sells it. A retry of the same offer after no answer
   * sends the same Idempotency-Key, so it holds once.
   */
  async function makeOffer(event) {
    event.preventDefault();
    const asset = state.selectedAsset;
    if (!asset) return;
    const form = event.currentTarget;
    const buyer = form.elements.buyer_id.value.trim();
    const client = form.elements.client.value.trim();
    const until = form.elements.expires_at.value ? new Date(form.elements.expires_at.value) : null;
    if (!until || Number.isNaN(until.getTime())) {
      alertError("Choose until when the offer holds the asset.");
      $("offer-until").focus();
      return;
    }
    const body = { buyer_id: buyer, client, expires_at: until.toISOString() };
    await runAction($("offer-submit"), async () => {
      let result;
      try {
        result = await act(`offer:${asset.id}`, "POST", OFFER_PATH, { asset_id: asset.id }, body);
      } catch (error) {
        if (mayHaveActed(error)) throw new Error(`${error.message} Press Make the offer again to retry: the same request is sent, so the asset is held once.`);
        if (problemCode(error) === "ASSET_UNAVAILABLE") {
          throw new Error(`${asset.id} was not offered: it is ${error.problem.asset_status || "no longer available"} (409 ASSET_UNAVAILABLE).`);
        }
        throw error;
      }
      notify(`${asset.id} is held for ${result?.buyer_id || buyer} until ${localTime(result?.expires_at || body.expires_at)}.`);
      form.reset();
    });
  }

  /** "1 Dec 2026, 09:00" and "opens in …" below it; "—" when no opening time is set. */
  function openingDetail(asset) {
    if (!asset.available_from) return el("span", null, "—");
    const span = el("span");
    span.append(timeEl(asset.available_from));
    if (opensLater(asset)) span.append(" ", opensNote(asset.available_from));
    return span;
  }

  function describeEvent(event) {
    const d = event.data || {};
    switch (event.type) {
      case "reservation.held":
        if (event.via === "offer") return `Offered to ${d.buyer_id ?? "a buyer"}: held until ${localTime(d.expires_at)}`;
        if (event.via === "waitlist") return `Handed to ${d.buyer_id ?? "the first waiter"}, first in the waiting list: held until ${localTime(d.expires_at)}`;
        return `Held by ${d.buyer_id ?? "a buyer"} until ${localTime(d.expires_at)}`;
      case "reservation.committed":
        return `Committed: sold, payment ${d.payment_reference ?? "—"}`;
      case "reservation.released":
        return "Released: available again";
      case "reservation.expired":
        return "Hold expired: available again";
      case "reservation.extended":
        return `Hold of ${d.buyer_id ?? "the buyer"} extended until ${localTime(d.expires_at)}`;
      case "reservation.voided":
        return `Sale voided (payment ${d.payment_reference ?? "—"}): available again`;
      case "asset.withdrawn":
        return "Withdrawn: off sale until reinstated";
      case "asset.reinstated":
        return "Reinstated: available again";
      case "asset.updated":
        return "Catalogue data changed (name, price or attributes)";
      case "waitlist.skipped":
        return `${d.buyer_id ?? "A waiter"} passed over in the waiting list: ${d.reason ?? "at the hold limit"}`;
      case "waitlist.cleared": {
        const n = (d.entries || []).length;
        return `Waiting list cleared (${n} ${n === 1 ? "waiter" : "waiters"}): ${d.reason ?? "the asset is no longer for sale"}`;
      }
      case "refund.requested":
        return `Refund requested for payment ${d.payment_reference ?? "—"} (${REASON_WORDS[d.reason] || d.reason || "refund"})`;
      case "refund.completed":
        return `Refund paid back for payment ${d.payment_reference ?? "—"}`;
      default:
        return event.type;
    }
  }

  function renderEvents(events) {
    const list = $("events");
    $("events-empty").hidden = events.length > 0;
    // Events never change; append the new ones.
    const known = list.childElementCount;
    if (events.length < known) list.replaceChildren();
    for (const event of events.slice(list.childElementCount)) {
      const li = el("li", `event event-${event.type.replace(/\W/g, "-")}`);
      li.dataset.sequence = String(event.sequence);
      const head = el("div", "event-head");
      head.append(el("span", "event-seq", `#${event.sequence}`), el("code", "event-type", event.type), timeEl(event.created_at, "event-time"));
      const by = event.actor ? ` (by ${event.actor})` : "";
      li.append(head, el("p", "event-text", describeEvent(event) + by));
      list.append(li);
    }
  }

  // ---- refunds -----------------------------------------------------------------

  async function loadRefunds() {
    const filter = state.refundFilter;
    const items = [];
    let cursor = null;
    // Every refund, page by page, as the timeline follows next_cursor.
    do {
      const params = new URLSearchParams({ limit: String(REFUND_PAGE) });
      if (filter) params.set("status", filter);
      if (cursor) params.set("cursor", cursor);
      const page = await api("GET", `/v1/refunds?${params}`);
      if (filter !== state.refundFilter) return;
      items.push(...(page?.items || []));
      cursor = page?.next_cursor || null;
    } while (cursor);
    // Waiting ones first; each group oldest first, as the API lists them.
    items.sort((a, b) => (a.status === "REQUESTED" ? 0 : 1) - (b.status === "REQUESTED" ? 0 : 1));
    renderRefunds(items);
  }

  function renderRefunds(items) {
    const list = $("refunds");
    const waiting = items.filter((r) => r.status === "REQUESTED").length;
    setText($("refunds-heading"), `Refunds${waiting ? ` waiting: ${waiting}` : ""}`);
    const empty = $("refunds-empty");
    empty.hidden = items.length > 0;
    setText(empty, state.refundFilter ? "No refunds waiting." : "No refunds.");
    const signature = JSON.stringify(items.map((r) => [r.refund_id, r.status]));
    if (list.dataset.signature === signature) return;
    list.dataset.signature = signature;
    const focused = document.activeElement?.closest?.("#refunds li")?.dataset.id;
    list.replaceChildren();
    for (const refund of items) {
      const li = el("li", `refund refund-${refund.status.toLowerCase()}`);
      li.dataset.id = refund.refund_id;
      const head = el("div", "refund-head");
      const open = button(refund.asset_id, "asset-link", () => showTimeline(refund.asset_id, open));
      open.setAttribute("aria-label", `${refund.asset_id}: show timeline`);
      head.append(open, el("span", `badge badge-${refund.status.toLowerCase()}`, refund.status));
      const text = el("p", "refund-text");
      text.append(
        el("span", null, `Payment `),
        el("code", null, refund.payment_reference),
        el("span", null, `: ${REASON_WORDS[refund.reason] || refund.reason}, since `),
        timeEl(refund.created_at),
      );
      li.append(head, text, el("p", "refund-id", refund.refund_id));
      list.append(li);
      if (focused === refund.refund_id) open.focus();
    }
  }

  // ---- polling -------------------------------------------------------------------

  function reportLoadError(error) {
    if (error instanceof ApiError && error.status === 401) return;
    alertError(failure(error));
  }

  async function tick() {
    state.timer = 0;
    if (state.paused || state.signedOut || document.hidden) return;
    state.lastTick = performance.now();
    const loads = [loadAssets(), loadCounts(), loadRefunds()];
    if (state.selected) loadTimeline().catch(() => {});
    const results = await Promise.allSettled(loads);
    const failed = results.find((r) => r.status === "rejected");
    // Paused (or hidden) while this poll was under way: the page keeps
    // saying so, and the next poll waits for the resume.
    if (state.signedOut || state.paused || document.hidden) return;
    if (failed) {
      state.failures += 1;
      const error = failed.reason;
      if (error instanceof ApiError && error.status === 403) {
        setLive("error", "Not allowed");
        alertError(`${failure(error)} The console needs an admin API key.`);
        return stopPolling();
      }
      setLive("error", error instanceof NoAnswer ? "Connection lost, retrying" : "Updates failing, retrying");
    } else {
      state.failures = 0;
      state.lastUpdate = new Date();
      setLive("ok", `Live, updated ${state.lastUpdate.toLocaleTimeString()}`);
    }
    schedule();
  }

  /** The next poll: a second after the last one began (longer after failures). */
  function schedule() {
    if (state.timer || state.paused || state.signedOut || document.hidden) return;
    const wait = POLL_MS * Math.min(2 ** state.failures, 10);
    const due = Math.max(0, state.lastTick + wait - performance.now());
    state.timer = setTimeout(tick, due);
  }

  function stopPolling() {
    clearTimeout(state.timer);
    state.timer = 0;
  }

  function onVisibility() {
    if (document.hidden) {
      stopPolling();
      setLive("paused", "Paused while the tab is hidden");
    } else if (!state.paused && !state.signedOut) {
      schedule();
    }
  }

  function togglePause() {
    state.paused = !state.paused;
    const b = $("pause");
    b.setAttribute("aria-pressed", String(state.paused));
    b.textContent = state.paused ? "Resume updates" : "Pause updates";
    if (state.paused) {
      stopPolling();
      setLive("paused", "Paused");
    } else {
      schedule();
    }
  }

  // ---- start -------------------------------------------------------------------

  async function start() {
    $("pause").addEventListener("click", togglePause);
    $("filters").addEventListener("submit", findAsset);
    $("search").addEventListener("input", onSearchInput);
    $("prev-page").addEventListener("click", () => {
      if (state.page === 0) return;
      state.page -= 1;
      refreshBoard();
    });
    $("next-page").addEventListener("click", () => {
      if (!state.nextCursor) return;
      state.pageCursors[state.page + 1] = state.nextCursor;
      state.page += 1;
      refreshBoard();
    });
    $("refund-filter").addEventListener("change", (e) => {
      state.refundFilter = e.target.value;
      $("refunds").dataset.signature = "";
      loadRefunds().catch(reportLoadError);
    });
    $("timeline-close").addEventListener("click", closeTimeline);
    $("timeline").addEventListener("keydown", (e) => {
      if (e.key === "Escape") closeTimeline();
    });
    $("create-form").addEventListener("submit", createAsset);
    $("opening-form").addEventListener("submit", (e) => {
      e.preventDefault();
      setOpening(false, $("opening-set"));
    });
    $("opening-now").addEventListener("click", (e) => setOpening(true, e.currentTarget));
    $("offer-form").addEventListener("submit", makeOffer);
    document.addEventListener("visibilitychange", onVisibility);
    setInterval(tickCountdowns, 250);

    // What this server offers: statuses, and actions that may not exist yet.
    try {
      state.doc = await api("GET", "/openapi.json");
      const statuses = state.doc?.components?.schemas?.AssetStatus?.enum;
      if (Array.isArray(statuses) && statuses.length > 0) state.statuses = statuses.slice();
      state.canWithdraw = hasOperation("POST", WITHDRAW_PATH);
      state.canReinstate = hasOperation("POST", REINSTATE_PATH);
      state.canSetOpening = hasOperation("PATCH", ASSET_PATH);
      state.canVoid = hasOperation("POST", VOID_PATH);
      state.canQueue = hasOperation("GET", WAITLIST_PATH);
      state.canOffer = hasOperation("POST", OFFER_PATH);
    } catch (error) {
      alertError(`Could not read /openapi.json: ${failure(error)}`);
    }
    renderStatusOptions();
    tick();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
