// @ts-check
// The buyer's page. It talks to the storefront's own /api only (the BFF holds
// every key), polls it every second, and keeps one table row per plate,
// rebuilding a row only when what it shows changes.

/** @typedef {import("../src/wire.ts").PlateView} PlateView */
/** @typedef {import("../src/wire.ts").PlatesAnswer} PlatesAnswer */
/** @typedef {import("../src/wire.ts").ActionAnswer} ActionAnswer */
/** @typedef {{ outcome: string, text: string }} Note */

const POLL_MS = 1000;

const state = {
  prefix: "",
  /** @type {PlateView[]} */
  plates: [],
  /** The BFF's clock minus this one, in ms: countdowns run on the BFF's. */
  clockOffset: 0,
  /** The outcome of the buyer's last action on each plate. @type {Map<string, Note>} */
  notes: new Map(),
  /** Plates with an action under way. @type {Set<string>} */
  busy: new Set(),
  /** Bumped when an action ends, so a poll that started before it is dropped. */
  generation: 0,
};

/** @param {string} id @returns {HTMLElement} */
function byId(id) {
  const element = document.getElementById(id);
  if (element === null) throw new Error(`#${id} is missing`);
  return element;
}

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A fresh Idempotency-Key (crypto.randomUUID needs a secure context; this does not). */
function newKey() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

// ---- talking to the BFF

/**
 * Sends a request; with an Idempotency-Key it is sent again, with the same
 * key, when the storefront cannot be reached or answers 502.
 * @param {string} method
 * @param {string} path
 * @param {{ body?: unknown, key?: string }} [options]
 * @returns {Promise<any>}
 */
async function call(method, path, options = {}) {
  /** @type {Record<string, string>} */
  const headers = {};
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  if (options.key !== undefined) headers["Idempotency-Key"] = options.key;
  const retries = options.key !== undefined || method === "GET" ? 3 : 1;
  for (let attempt = 1; ; attempt++) {
    /** @type {Response} */
    let response;
    try {
      response = await fetch(path, {
        method,
        headers,
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
      });
    } catch {
      if (attempt >= retries) throw new Error("The storefront cannot be reached. Check your connection.");
      await sleep(300 * attempt);
      continue;
    }
    if (response.status === 502 && attempt < retries) {
      await sleep(300 * attempt);
      continue;
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(typeof data.message === "string" ? data.message : `HTTP ${response.status}`);
    return data;
  }
}

/** @param {string} prefix @returns {Promise<PlatesAnswer>} */
const fetchPlates = (prefix) => call("GET", `/api/plates?prefix=${encodeURIComponent(prefix)}`);

// ---- what a plate shows

/** @param {PlateView} plate */
function plateState(plate) {
  if (plate.mine?.status === "HELD") return "mine";
  if (plate.mine?.status === "COMMITTED") return "bought";
  if (plate.status === "HELD") return plate.queue_position === null ? "held" : "queued";
  return plate.status.toLowerCase();
}

// Prices come in minor units; how many a currency has is ISO 4217's
// exponent (2 unless listed here). Intl's own fraction digits are not that
// (it formats IDR and HUF with none), so they are set explicitly.
/** @type {Record<string, number>} */
const EXPONENTS = {
  BIF: 0, CLP: 0, DJF: 0, GNF: 0, ISK: 0, JPY: 0, KMF: 0, KRW: 0, PYG: 0, RWF: 0, UGX: 0, UYI: 0, VND: 0, VUV: 0,
  XAF: 0, XOF: 0, XPF: 0, BHD: 3, IQD: 3, JOD: 3, KWD: 3, LYD: 3, OMR: 3, TND: 3, CLF: 4, UYW: 4,
};

/** @param {PlateView["price"]} price */
function formatPrice(price) {
  if (price === null) return "No price";
  const digits = EXPONENTS[price.currency] ?? 2;
  try {
    return new Intl.NumberFormat(undefined, {
      style: "currency",
      currency: price.currency,
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    }).format(price.amount / 10 ** digits);
  } catch {
    return `${price.amount} ${price.currency} (minor units)`;
  }
}

/** @param {string} iso */
function remaining(iso) {
  const ms = Math.max(0, Date.parse(iso) - (Date.now() + state.clockOffset));
  const total = Math.ceil(ms / 1000);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = String(total % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${s}` : `${m}:${s}`;
}

/** @param {ActionAnswer} answer @returns {Note} */
function describe(answer) {
  switch (answer.outcome) {
    case "held":
      return { outcome: "held", text: answer.again ? "You already held this plate (another tab)." : "Held for you: pay before the countdown ends." };
    case "unavailable":
      return {
        outcome: "unavailable",
        text:
          answer.asset_status === "HELD"
            ? `Someone else holds this plate${answer.waitlist_length > 0 ? ` and ${answer.waitlist_length} wait for it` : ""}. Join the waiting list to get it when their hold ends.`
            : answer.asset_status === "SOLD"
              ? "This plate has been sold."
              : "This plate is not on sale.",
      };
    case "queued":
      return { outcome: "queued", text: `You joined the waiting list: number ${answer.position}.` };
    case "left":
      return { outcome: "left", text: "You left the waiting list." };
    case "released":
      return { outcome: "released", text: "You released this plate." };
    case "paid":
      return { outcome: "paid", text: `Paid (payment ${answer.payment_reference}): the plate is yours.` };
    case "refunded":
      return { outcome: "refunded", text: refundText(answer.refund) };
    case "refused":
      return { outcome: "refused", text: answer.message };
  }
}

/**
 * @param {"POST" | "DELETE"} method
 * @param {"hold" | "waitlist" | "release" | "pay"} verb
 * @param {boolean} late
 */
function pendingText(method, verb, late) {
  if (verb === "pay") return late ? "Paying once the hold has lapsed…" : "Paying…";
  if (verb === "waitlist") return method === "DELETE" ? "Leaving the waiting list…" : "Joining the waiting list…";
  return verb === "hold" ? "Holding…" : "Releasing…";
}

/** @type {Record<string, string>} */
const REFUND_REASONS = {
  HOLD_EXPIRED: "the hold had lapsed when the payment came",
  RESERVATION_RELEASED: "the hold had been released",
  ALREADY_COMMITTED: "the plate was already paid for",
  AMOUNT_MISMATCH: "the amount paid did not match the price",
  SALE_VOIDED: "the sale was voided",
};

/** @param {NonNullable<PlateView["refund"]>} refund */
function refundText(refund) {
  const why = REFUND_REASONS[refund.reason] ?? "it could not be honoured";
  return `payment refunded: ${why} (${refund.reason}; refund ${refund.refund_id})`;
}

// ---- building rows

/**
 * @param {string} tag
 * @param {Record<string, string>} [attributes]
 * @param {(Node | string)[]} [children]
 */
function el(tag, attributes = {}, children = []) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  element.append(...children);
  return element;
}

/** @param {string} iso */
const countdown = (iso) => el("time", { "data-testid": "countdown", "data-expires": iso, datetime: iso }, [remaining(iso)]);

/**
 * @param {PlateView} plate
 * @param {string} testid
 * @param {string} label
 * @param {() => void} onClick
 */
function button(plate, testid, label, onClick) {
  const b = el("button", { type: "button", "data-testid": testid, "aria-label": `${label}: ${plate.id}` }, [label]);
  if (state.busy.has(plate.id)) b.setAttribute("disabled", "");
  b.addEventListener("click", onClick);
  return b;
}

/** @param {PlateView} plate */
function statusCell(plate) {
  const kind = plateState(plate);
  const cell = el("td", { "data-testid": "plate-status" });
  if (kind === "mine" && plate.mine !== null) {
    cell.append(el("strong", { "data-testid": "you-hold" }, ["You hold this"]));
    if (plate.mine.via === "waitlist") cell.append(" (from the waiting list)");
    cell.append(el("span", { class: "detail" }, [countdown(plate.mine.expires_at), " left to pay"]));
  } else if (kind === "bought") {
    cell.append(el("strong", { "data-testid": "you-bought" }, ["You bought this"]));
  } else if (kind === "held" || kind === "queued") {
    cell.append("Held by another buyer");
    cell.append(
      plate.hold_expires_at === null
        ? el("span", { class: "detail" }, ["changing hands"])
        : el("span", { class: "detail" }, [countdown(plate.hold_expires_at), " left"]),
    );
    if (plate.queue_position !== null) {
      cell.append(
        el("span", { class: "detail", "data-testid": "queue" }, [
          "You are number ",
          el("b", { "data-testid": "queue-position" }, [String(plate.queue_position)]),
          " in the queue",
        ]),
      );
    } else if (plate.waitlist_length > 0) {
      cell.append(el("span", { class: "detail" }, [`${plate.waitlist_length} waiting`]));
    }
  } else {
    cell.append({ available: "Available", sold: "Sold", withdrawn: "Not on sale" }[kind] ?? kind);
  }
  if (plate.refund !== null) {
    cell.append(el("p", { class: "refund", "data-testid": "payment-result" }, [refundText(plate.refund)]));
  }
  const note = state.notes.get(plate.id);
  if (note !== undefined && !(note.outcome === "refunded" && plate.refund !== null)) {
    cell.append(el("p", { class: `note note-${note.outcome}`, "data-testid": "plate-note", "data-outcome": note.outcome }, [note.text]));
  }
  return cell;
}

/** @param {PlateView} plate */
function actionsCell(plate) {
  const kind = plateState(plate);
  const cell = el("td", { class: "actions" });
  if (kind === "available") cell.append(button(plate, "hold-button", "Hold", () => act(plate, "POST", "hold")));
  if (kind === "held") cell.append(button(plate, "join-button", "Join waiting list", () => act(plate, "POST", "waitlist")));
  if (kind === "queued") cell.append(button(plate, "leave-button", "Leave waiting list", () => act(plate, "DELETE", "waitlist")));
  if (kind === "mine") {
    cell.append(
      button(plate, "pay-button", "Pay", () => act(plate, "POST", "pay", { late: false })),
      button(plate, "pay-late-button", "Pay late (demo)", () => act(plate, "POST", "pay", { late: true })),
      button(plate, "release-button", "Release", () => act(plate, "POST", "release")),
    );
  }
  return cell;
}

/** @param {PlateView} plate */
function buildRow(plate) {
  return el("tr", { "data-testid": "plate", "data-plate-id": plate.id, "data-state": plateState(plate), "aria-busy": String(state.busy.has(plate.id)) }, [
    el("th", { scope: "row" }, [el("span", { class: "plate-id" }, [plate.id]), el("span", { class: "plate-name" }, [plate.name])]),
    el("td", { "data-testid": "plate-price" }, [formatPrice(plate.price)]),
    statusCell(plate),
    actionsCell(plate),
  ]);
}

function render() {
  const body = byId("plates-body");
  /** @type {Map<string, HTMLElement>} */
  const rows = new Map();
  for (const row of body.querySelectorAll("tr")) rows.set(row.dataset.plateId ?? "", row);
  const active = document.activeElement instanceof HTMLElement ? document.activeElement : null;
  const focusedPlate = active?.closest("tr")?.dataset.plateId;

  /** @type {ChildNode | null} */
  let next = body.firstChild;
  for (const plate of state.plates) {
    const signature = JSON.stringify([plate, state.notes.get(plate.id) ?? null, state.busy.has(plate.id)]);
    let row = rows.get(plate.id);
    rows.delete(plate.id);
    if (row === undefined || row.dataset.signature !== signature) {
      const fresh = buildRow(plate);
      fresh.dataset.signature = signature;
      if (row !== undefined) {
        if (row === next) next = fresh;
        row.replaceWith(fresh);
      }
      row = fresh;
    }
    if (row !== next) body.insertBefore(row, next);
    next = row.nextSibling;
  }
  for (const stale of rows.values()) stale.remove();

  // A rebuilt row takes the focus with it: give it to the row's first control.
  if (focusedPlate !== undefined && (document.activeElement === null || document.activeElement === document.body)) {
    const row = body.querySelector(`tr[data-plate-id="${CSS.escape(focusedPlate)}"]`);
    const target = row?.querySelector("button:not([disabled])") ?? row?.querySelector("th");
    if (target instanceof HTMLElement) {
      if (target.tagName === "TH") target.tabIndex = -1;
      target.focus();
    }
  }

  byId("results-heading").textContent =
    state.prefix === "" ? `Plates (${state.plates.length})` : `Plates starting with ${state.prefix} (${state.plates.length})`;
  byId("empty").hidden = state.plates.length > 0;
}

function tick() {
  for (const time of document.querySelectorAll("time[data-expires]")) {
    const text = remaining(time.getAttribute("data-expires") ?? "");
    if (time.textContent !== text) time.textContent = text;
  }
}

/** Says the outcome of a click to screen readers (the row shows it to everyone). @param {string} text */
function announce(text) {
  byId("announcer").textContent = text;
}

/**
 * A message about the whole page; an error is cleared by the next poll that works.
 * @param {string} text
 * @param {"info" | "error"} [kind]
 */
function say(text, kind = "info") {
  const message = byId("message");
  message.textContent = text;
  message.dataset.kind = kind;
}

/** @param {unknown} err */
const sayError = (err) => say(err instanceof Error ? err.message : String(err), "error");

// ---- polling and actions

async function refresh() {
  const generation = state.generation;
  const prefix = state.prefix;
  const answer = await fetchPlates(prefix);
  if (generation !== state.generation || prefix !== state.prefix) return;
  state.clockOffset = Date.parse(answer.now) - Date.now();
  const before = new Map(state.plates.map((plate) => [plate.id, plateState(plate)]));
  state.plates = answer.items;
  for (const plate of state.plates) {
    if (before.get(plate.id) === "queued" && plateState(plate) === "mine") {
      say(`${plate.id} is yours: it was handed to you from the waiting list.`);
    }
  }
  render();
}

async function poll() {
  try {
    await refresh();
    if (byId("message").dataset.kind === "error") say("");
  } catch (err) {
    sayError(err);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

/**
 * @param {PlateView} plate
 * @param {"POST" | "DELETE"} method
 * @param {"hold" | "waitlist" | "release" | "pay"} verb
 * @param {{ late: boolean }} [body]
 */
async function act(plate, method, verb, body) {
  if (state.busy.has(plate.id)) return;
  state.busy.add(plate.id);
  state.notes.set(plate.id, { outcome: "pending", text: pendingText(method, verb, body?.late === true) });
  render();
  try {
    /** @type {ActionAnswer} */
    const answer = await call(method, `/api/plates/${encodeURIComponent(plate.id)}/${verb}`, {
      body: method === "POST" ? body ?? {} : undefined,
      key: method === "POST" ? newKey() : undefined,
    });
    const note = describe(answer);
    state.notes.set(plate.id, note);
    announce(`${plate.id}: ${note.text}`);
  } catch (err) {
    const text = err instanceof Error ? err.message : String(err);
    state.notes.set(plate.id, { outcome: "error", text });
    announce(`${plate.id}: ${text}`);
  } finally {
    state.busy.delete(plate.id);
    state.generation++;
  }
  await refresh().catch(sayError);
}

/** @param {string} prefix */
async function search(prefix) {
  state.prefix = prefix;
  state.notes.clear();
  state.generation++;
  const url = new URL(location.href);
  if (prefix === "") url.searchParams.delete("prefix");
  else url.searchParams.set("prefix", prefix);
  history.replaceState(null, "", url);
  await refresh().catch(sayError);
}

const input = byId("prefix");
if (!(input instanceof HTMLInputElement)) throw new Error("#prefix is not an input");
byId("search").addEventListener("submit", (event) => {
  event.preventDefault();
  input.value = input.value.trim().toUpperCase();
  if (!input.checkValidity()) {
    say("A plate number has only letters, digits, '.', '_' and '-'.", "error");
    return;
  }
  void search(input.value);
});

input.value = (new URL(location.href).searchParams.get("prefix") ?? "").toUpperCase();
state.prefix = input.value;
setInterval(tick, 250);
void poll();
