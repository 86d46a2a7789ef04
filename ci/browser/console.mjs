// The operator console as an operator meets it, in headless Chromium: the
// page signs in with an API key (HTTP Basic, as a browser does), shows assets
// created through the API, turns a row HELD with a running countdown and then
// SOLD without a reload, lists a refund waiting, opens an asset's timeline,
// creates an asset from its form, withdraws and reinstates assets through the
// real API (a held one only after confirming, which releases the hold),
// explains the ASSET_HELD and ASSET_SOLD conflicts of a stale page, voids a
// sale from its timeline (a retry after no answer sends the same
// Idempotency-Key), shows and sets when a sale opens, shows prices,
// attributes and waiting lists, lists the ids that start with what is typed,
// makes an offer to a named buyer from a timeline, stops polling while
// hidden, passes a basic accessibility check, and never requests anything
// from another origin. Screenshots: target/console.png (1280x800) and
// target/console-phone.png (375x812).
//
//   HOLDFAST_URL=http://127.0.0.1:8080 [HOLDFAST_TOKEN=hf_…] node console.mjs
//
// Expects a holdfast whose first page of assets has room for the ones this
// creates (a fresh database is simplest). SCREENSHOT_DIR, when relative, is
// taken from the repository root (default target).

import { mkdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { randomUUID } from "node:crypto";
import { chromium } from "playwright-core";

const CHROMIUM = "/usr/bin/chromium";
const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];
const WAIT_MS = 10_000;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const shotDir = path.resolve(repoRoot, process.env.SCREENSHOT_DIR || "target");

class CheckFailed extends Error {}

const base = (process.env.HOLDFAST_URL ?? "").trim().replace(/\/+$/, "");
const token = (process.env.HOLDFAST_TOKEN ?? "").trim();
// The storefront an offer is made for: a configured storefront key's name,
// or "-" in open mode.
const offerClient = (process.env.HOLDFAST_OFFER_CLIENT ?? "-").trim();
if (base === "") {
  console.error("console: set HOLDFAST_URL, e.g. HOLDFAST_URL=http://127.0.0.1:8080");
  process.exit(2);
}

let step = "start";
try {
  console.log(await checkConsole());
} catch (err) {
  const detail = err instanceof CheckFailed ? err.message : (err?.stack ?? String(err));
  console.error(`console check FAILED against ${base} at step "${step}": ${detail}`);
  process.exitCode = 1;
}

function say(text) {
  step = text;
  console.log(`console: ${text}`);
}

/** The API, as the other clients use it. */
async function call(method, apiPath, body, idempotencyKey) {
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotencyKey) headers["Idempotency-Key"] = idempotencyKey;
  const response = await fetch(`${base}${apiPath}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON: kept as text for the message
  }
  return { status: response.status, json, text };
}

async function expectStatus(method, apiPath, body, key, wanted) {
  const r = await call(method, apiPath, body, key);
  if (!wanted.includes(r.status)) throw new CheckFailed(`${method} ${apiPath} answered ${r.status}, expected ${wanted.join(" or ")}: ${r.text}`);
  return r.json;
}

/** "4:05" or "1:02:03" as seconds. */
function seconds(text) {
  const parts = text.trim().split(":").map(Number);
  if (parts.length < 2 || parts.some((n) => !Number.isInteger(n))) return NaN;
  return parts.reduce((total, n) => total * 60 + n, 0);
}

async function checkConsole() {
  const origin = new URL(base).origin;
  const run = Date.now().toString(36).slice(-5).toUpperCase();

  say("creating assets through the API");
  const lots = [
    { id: `EQ-88392-${run}`, name: "Caterpillar 320 excavator" },
    { id: `LOT-17-${run}`, name: "Oil on canvas, harbour at dusk" },
    {
      id: `PL-AB123-${run}`,
      name: "Licence plate AB 123",
      price: { amount: 1500000000, currency: "IDR" },
      attributes: { region: "AB", digits: 3, premium: true },
    },
    { id: `SOFA-${run}`, name: "Lounge chair and ottoman" },
    { id: `CLK-${run}`, name: "Longcase clock, walnut" },
    { id: `VASE-${run}`, name: "Celadon vase" },
  ];
  for (const lot of lots) await expectStatus("POST", "/v1/assets", lot, undefined, [201]);
  const [excavator, painting, plate, sofa, clock, vase] = lots.map((l) => l.id);
  // Its sale opens in two hours.
  const bell = `BELL-${run}`;
  const opensAt = new Date(Date.now() + 2 * 3600 * 1000).toISOString();
  await expectStatus("POST", "/v1/assets", { id: bell, name: "Ship's bell, bronze", available_from: opensAt }, undefined, [201]);

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS, headless: true });
  try {
    const context = await browser.newContext({
      viewport: { width: 1280, height: 800 },
      serviceWorkers: "block",
      reducedMotion: "reduce",
      ...(token ? { httpCredentials: { username: "operator", password: token } } : {}),
    });
    const page = await context.newPage();

    // Every request: same-origin ones go through, anything else is recorded
    // and refused, so the check proves the page works offline.
    const foreign = new Set();
    const requests = [];
    await context.route("**/*", (route) => {
      const url = route.request().url();
      if (new URL(url).origin === origin) {
        requests.push({ at: Date.now(), url: new URL(url) });
        return route.continue();
      }
      foreign.add(url);
      return route.abort("blockedbyclient");
    });
    page.on("request", (request) => {
      const url = request.url();
      if (!/^(data|blob|about):/.test(url) && new URL(url).origin !== origin) foreign.add(url);
    });
    const problems = [];
    page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
    page.on("console", (message) => {
      if (message.type() === "error") problems.push(`console error: ${message.text()}`);
    });
    // window.confirm: each step that expects one says how to answer it.
    const dialogs = [];
    let answerDialog = null;
    page.on("dialog", async (dialog) => {
      dialogs.push(dialog.message());
      const answer = answerDialog;
      answerDialog = null;
      if (answer === "accept") await dialog.accept();
      else await dialog.dismiss();
      if (!answer) problems.push(`an unexpected dialog: ${dialog.message()}`);
    });
    const sent = []; // what the page sent to the actions under test
    page.on("request", (request) => {
      const url = new URL(request.url());
      if (request.method() !== "GET" && /\/(withdraw|reinstate|void)$|^\/v1\/assets\/[^/]+$/.test(url.pathname)) {
        sent.push({ method: request.method(), path: url.pathname, body: request.postData(), key: request.headers()["idempotency-key"] ?? null });
      }
    });
    let navigations = 0;
    page.on("framenavigated", (frame) => {
      if (frame === page.mainFrame()) navigations += 1;
    });
    const failedResponses = [];
    const answered = [];
    page.on("response", (response) => {
      if (response.status() >= 400) failedResponses.push(`${response.status()} ${response.request().method()} ${response.url()}`);
      answered.push({ url: new URL(response.url()), status: response.status() });
    });

    say("opening /console");
    const response = await page.goto(`${base}/console`, { waitUntil: "load" });
    if (!response || response.status() !== 200) throw new CheckFailed(`GET /console ended with ${response ? response.status() : "no response"}`);
    const csp = response.headers()["content-security-policy"] ?? "";
    for (const part of ["default-src 'self'", "frame-ancestors 'none'"]) {
      if (!csp.includes(part)) throw new CheckFailed(`Content-Security-Policy lacks ${part}: ${csp}`);
    }
    if (csp.includes("unsafe-inline")) throw new CheckFailed(`Content-Security-Policy allows inline code: ${csp}`);

    const row = (id) => page.locator(`#asset-rows tr[data-id="${id}"]`);
    const statusOf = (id) => row(id).locator(".cell-status .badge");
    for (const id of [excavator, painting, plate, sofa, clock, vase, bell]) {
      await row(id).waitFor({ timeout: WAIT_MS }).catch(() => {
        throw new CheckFailed(`the row of ${id} did not appear (is it on the first page? use a fresh database)`);
      });
      await expectText(statusOf(id), "AVAILABLE", `${id} shows AVAILABLE`);
    }
    await page.evaluate(() => {
      window.__sameDocument = true;
    });
    if (token) {
      // The person signed in once; the browser sends those credentials with
      // the page's own API requests (the server refuses them otherwise), and
      // the script never sees the key.
      const apiCalls = answered.filter((r) => r.url.pathname.startsWith("/v1/"));
      const refused = apiCalls.filter((r) => r.status === 401);
      if (apiCalls.length === 0) throw new CheckFailed("the page made no API request");
      if (refused.length > 0) throw new CheckFailed(`API requests refused as unauthenticated: ${refused.map((r) => r.url.pathname).join(", ")}`);
    }

    say("holding an asset through the API; the row turns HELD with a countdown");
    const hold = await expectStatus(
      "POST",
      `/v1/assets/${excavator}/reservations`,
      { buyer_id: "buyer-4411", hold_seconds: 300 },
      randomUUID(),
      [201],
    );
    await expectText(statusOf(excavator), "HELD", `${excavator} turns HELD`);
    const countdown = row(excavator).locator(".cell-hold time.countdown");
    await countdown.waitFor({ timeout: WAIT_MS });
    const first = seconds(await countdown.textContent());
    await page.waitForTimeout(1_200);
    const second = seconds(await countdown.textContent());
    if (!(first > 0 && first <= 300)) throw new CheckFailed(`the countdown read ${first}s, expected 1..300`);
    if (!(second < first)) throw new CheckFailed(`the countdown did not decrease: ${first}s, then ${second}s 1.2 s later`);
    await expectText(row(excavator).locator(".cell-buyer"), "buyer-4411", "the buyer is shown");

    say("polling: at most once a second");
    const windowStart = Date.now();
    await page.waitForTimeout(4_000);
    const listCalls = requests.filter((r) => r.at >= windowStart && r.url.pathname === "/v1/assets").length;
    if (listCalls > 5) throw new CheckFailed(`${listCalls} list requests in 4 s: more than one a second`);
    if (listCalls < 2) throw new CheckFailed(`${listCalls} list requests in 4 s: the board is not polling`);

    say("committing it through the API; the row turns SOLD");
    await expectStatus(
      "POST",
      `/v1/reservations/${hold.reservation_id}/commit`,
      { payment_reference: `pay-${run}-1` },
      randomUUID(),
      [200],
    );
    await expectText(statusOf(excavator), "SOLD", `${excavator} turns SOLD`);
    if ((await row(excavator).locator("time.countdown").count()) !== 0) throw new CheckFailed("a SOLD row still shows a countdown");

    say("a refund waits: a payment for a released hold");
    const released = await expectStatus("POST", `/v1/assets/${plate}/reservations`, { buyer_id: "buyer-207" }, randomUUID(), [201]);
    await expectStatus("POST", `/v1/reservations/${released.reservation_id}/release`, {}, randomUUID(), [200]);
    const refused = await expectStatus(
      "POST",
      `/v1/reservations/${released.reservation_id}/commit`,
      { payment_reference: `pay-${run}-2` },
      randomUUID(),
      [409],
    );
    const refundId = refused?.refund?.refund_id;
    if (!refundId) throw new CheckFailed(`the refused commit carried no refund: ${JSON.stringify(refused)}`);
    const refund = page.locator(`#refunds li[data-id="${refundId}"]`);
    await refund.waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed(`refund ${refundId} did not appear in the refunds panel`);
    });
    await expectText(refund, "REQUESTED", "the refund reads REQUESTED");
    await expectText(refund, `pay-${run}-2`, "the refund names its payment");

    say("another hold stays live for the screenshot");
    const paintingHold = await expectStatus("POST", `/v1/assets/${painting}/reservations`, { buyer_id: "buyer-9051", hold_seconds: 1800 }, randomUUID(), [201]);
    await expectText(statusOf(painting), "HELD", `${painting} turns HELD`);

    say("opening the timeline of the sold asset");
    await row(excavator).locator("button.asset-link").click();
    const timeline = page.locator("#timeline");
    await timeline.waitFor({ state: "visible", timeout: WAIT_MS });
    await expectText(page.locator("#timeline-heading"), excavator, "the timeline names the asset");
    const events = page.locator("#events li");
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 2, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline did not list the held and committed events");
    });
    const types = await events.locator(".event-type").allTextContents();
    if (types[0] !== "reservation.held" || types[1] !== "reservation.committed") {
      throw new CheckFailed(`the timeline lists ${types.join(", ")}; expected reservation.held, reservation.committed`);
    }
    await expectText(events.nth(0), "buyer-4411", "the held event names the buyer");
    const focusedPanel = await page.evaluate(() => document.activeElement?.id);
    if (focusedPanel !== "timeline") throw new CheckFailed(`opening the timeline left focus on #${focusedPanel}, expected #timeline`);

    say("creating an asset from the page");
    const created = `GAV-${run}`;
    await page.getByLabel("Id", { exact: true }).fill(created);
    await page.getByLabel("Name", { exact: true }).fill("Gavel, oak, 19th century");
    await page.getByRole("button", { name: "Create asset" }).click();
    await expectText(page.locator("#notice"), `Created ${created}`, "the page confirms the new asset");
    await row(created).waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed(`the asset created from the page (${created}) did not appear on the board`);
    });
    await page.getByLabel("Id", { exact: true }).fill(created);
    await page.getByLabel("Name", { exact: true }).fill("Again");
    await page.getByRole("button", { name: "Create asset" }).click();
    await expectText(page.locator("#alert"), "already exists", "the API's problem is shown to the operator");
    await page.locator("#alert button").click();
    await page.getByLabel("Id", { exact: true }).fill("");
    await page.getByLabel("Name", { exact: true }).fill("");

    say("an asset whose sale opens later says when");
    const opens = row(bell).locator(".cell-status time.opens");
    await expectText(opens, "opens in", `${bell} says when its sale opens`);
    const opensText = (await opens.textContent()).trim();
    if (!/^opens in (1 h 5\d|2 h 00) min$/.test(opensText)) throw new CheckFailed(`${bell} reads "${opensText}", expected about two hours`);

    say("withdrawing an available asset from the page; it reads WITHDRAWN without a reload");
    if ((await row(excavator).getByRole("button", { name: `Withdraw ${excavator}` }).count()) !== 0) throw new CheckFailed("a SOLD asset offers Withdraw");
    const sentBefore = sent.length;
    await page.getByRole("button", { name: `Withdraw ${sofa}`, exact: true }).click();
    await expectText(statusOf(sofa), "WITHDRAWN", `${sofa} turns WITHDRAWN`);
    await expectText(page.locator("#notice"), `${sofa} is WITHDRAWN`, "the withdrawal is confirmed");
    const withdrawal = sent.slice(sentBefore);
    if (withdrawal.length !== 1 || withdrawal[0].path !== `/v1/assets/${sofa}/withdraw` || withdrawal[0].body !== "{}") {
      throw new CheckFailed(`withdrawing an available asset sent ${JSON.stringify(withdrawal)}`);
    }
    if ((await expectStatus("GET", `/v1/assets/${sofa}`, undefined, undefined, [200])).status !== "WITHDRAWN") throw new CheckFailed("the API does not read WITHDRAWN");
    await expectText(page.locator('#counts button[data-status="WITHDRAWN"] .count-n'), "1", "the Withdrawn count reads 1");
    await page.locator('label[for="status-WITHDRAWN"]').click(); // the chip a person clicks
    await expectText(page.locator("#assets-caption"), "Withdrawn assets", "the board filters by WITHDRAWN");
    await page.waitForFunction(
      (id) => {
        const shown = [...document.querySelectorAll("#asset-rows tr")];
        return shown.length === 1 && shown[0].dataset.id === id;
      },
      sofa,
      { timeout: WAIT_MS },
    ).catch(async () => {
      const ids = await page.locator("#asset-rows tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.id));
      throw new CheckFailed(`the Withdrawn filter shows ${ids.join(", ") || "nothing"}, expected ${sofa} alone`);
    });
    await page.locator('label[for="status-all"]').click();
    await row(excavator).waitFor({ timeout: WAIT_MS });

    say("reinstating it; it reads AVAILABLE");
    await page.getByRole("button", { name: `Reinstate ${sofa}`, exact: true }).click();
    await expectText(statusOf(sofa), "AVAILABLE", `${sofa} turns AVAILABLE`);
    await expectText(page.locator("#notice"), `${sofa} is AVAILABLE again`, "the reinstatement is confirmed");
    if ((await expectStatus("GET", `/v1/assets/${sofa}`, undefined, undefined, [200])).status !== "AVAILABLE") throw new CheckFailed("the API does not read AVAILABLE");
    await row(sofa).locator("button.asset-link").click();
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 2, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline did not list the withdrawal and the reinstatement");
    });
    const sofaTypes = await page.locator("#events li .event-type").allTextContents();
    if (sofaTypes.join() !== "asset.withdrawn,asset.reinstated") throw new CheckFailed(`the timeline lists ${sofaTypes.join(", ")}`);
    await expectText(page.locator("#events li").nth(0), "Withdrawn: off sale", "the withdrawal reads plainly");
    await expectText(page.locator("#events li").nth(1), "Reinstated", "the reinstatement reads plainly");
    await page.locator("#timeline-close").click();

    say("withdrawing a held asset asks first; confirmed, it ends the hold");
    const clockHold = await expectStatus("POST", `/v1/assets/${clock}/reservations`, { buyer_id: "buyer-3377", hold_seconds: 600 }, randomUUID(), [201]);
    await expectText(statusOf(clock), "HELD", `${clock} turns HELD`);
    await expectText(row(clock).locator(".cell-buyer"), "buyer-3377", "the buyer is shown");
    let mark = sent.length;
    answerDialog = "dismiss";
    await page.getByRole("button", { name: `Withdraw ${clock}`, exact: true }).click();
    await page.waitForTimeout(500);
    if (!(dialogs.at(-1) ?? "").includes("buyer-3377")) throw new CheckFailed(`the confirmation does not name the buyer: ${dialogs.at(-1)}`);
    if (sent.length !== mark) throw new CheckFailed("declining the confirmation still sent a withdrawal");
    await expectText(statusOf(clock), "HELD", `${clock} stays HELD when the operator declines`);
    mark = sent.length;
    answerDialog = "accept";
    await page.getByRole("button", { name: `Withdraw ${clock}`, exact: true }).click();
    await expectText(statusOf(clock), "WITHDRAWN", `${clock} turns WITHDRAWN`);
    await expectText(page.locator("#notice"), "buyer-3377 was released", "the page says the hold was released");
    const forced = sent.slice(mark);
    if (forced.length !== 1 || JSON.parse(forced[0].body ?? "null")?.force !== true) throw new CheckFailed(`withdrawing a held asset sent ${JSON.stringify(forced)}`);
    const releasedHold = await expectStatus("GET", `/v1/reservations/${clockHold.reservation_id}`, undefined, undefined, [200]);
    if (releasedHold.status !== "RELEASED") throw new CheckFailed(`the withdrawn asset's hold reads ${releasedHold.status}, expected RELEASED`);
    if ((await row(clock).locator("time.countdown").count()) !== 0) throw new CheckFailed("a WITHDRAWN row still shows a countdown");

    say("a stale page: ASSET_HELD and ASSET_SOLD are explained");
    await page.locator("#pause").click();
    await expectText(page.locator("#live-state"), "Paused", "updates pause");
    await page.waitForTimeout(1_500); // a poll already under way may finish
    const vaseHold = await expectStatus("POST", `/v1/assets/${vase}/reservations`, { buyer_id: "buyer-5150", hold_seconds: 600 }, randomUUID(), [201]);
    await expectText(statusOf(vase), "AVAILABLE", "the paused board still shows the vase AVAILABLE");
    await page.getByRole("button", { name: `Withdraw ${vase}`, exact: true }).click();
    await expectText(page.locator("#alert"), "ASSET_HELD", "the page explains ASSET_HELD");
    await expectText(statusOf(vase), "HELD", "after the refusal the row shows the hold");
    await expectStatus("POST", `/v1/reservations/${vaseHold.reservation_id}/commit`, { payment_reference: `pay-${run}-3` }, randomUUID(), [200]);
    answerDialog = "accept";
    await page.getByRole("button", { name: `Withdraw ${vase}`, exact: true }).click();
    await expectText(page.locator("#alert"), "ASSET_SOLD", "the page explains ASSET_SOLD");
    await expectText(statusOf(vase), "SOLD", "after the refusal the row shows the sale");
    if ((await page.getByRole("button", { name: `Withdraw ${vase}`, exact: true }).count()) !== 0) throw new CheckFailed("a SOLD asset offers Withdraw");
    await page.locator("#alert button").click();
    await page.locator("#pause").click();
    await page.waitForFunction(() => document.getElementById("live-state")?.dataset.state === "ok", null, { timeout: WAIT_MS });

    say("voiding the sale from its timeline; a retry after no answer reuses its Idempotency-Key");
    await row(vase).locator("button.asset-link").click();
    const voidButton = page.getByRole("button", { name: `Void the sale of ${vase}`, exact: true });
    await voidButton.waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline of a SOLD asset offers no Void sale");
    });
    mark = sent.length;
    // The first attempt gets no answer.
    await page.route(`${origin}/v1/reservations/*/void`, (route) => route.abort("connectionreset"), { times: 1 });
    answerDialog = "accept";
    await voidButton.click();
    await expectText(page.locator("#alert"), "Press Void sale again", "the page offers the retry");
    if (!(dialogs.at(-1) ?? "").includes("buyer-5150")) throw new CheckFailed(`the void confirmation does not name the buyer: ${dialogs.at(-1)}`);
    answerDialog = "accept";
    await voidButton.click();
    await expectText(statusOf(vase), "AVAILABLE", `${vase} is AVAILABLE again after the void`);
    await expectText(page.locator("#notice"), "VOIDED", "the void is confirmed");
    const voids = sent.slice(mark);
    if (voids.length !== 2 || !voids[0].key || voids[0].key !== voids[1].key) {
      throw new CheckFailed(`the retried void sent ${JSON.stringify(voids)}: expected two requests with one Idempotency-Key`);
    }
    const voided = await expectStatus("GET", `/v1/reservations/${vaseHold.reservation_id}`, undefined, undefined, [200]);
    if (voided.status !== "VOIDED") throw new CheckFailed(`the voided reservation reads ${voided.status}`);
    const voidRefund = voided.refunds?.find((r) => r.reason === "SALE_VOIDED");
    if (!voidRefund || voided.refunds.length !== 1) throw new CheckFailed(`the void made refunds ${JSON.stringify(voided.refunds)}, expected one SALE_VOIDED`);
    await expectText(page.locator(`#refunds li[data-id="${voidRefund.refund_id}"]`), "sale voided", "the refund of the voided sale waits");
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 4, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline did not list the void");
    });
    const vaseTypes = await page.locator("#events li .event-type").allTextContents();
    if (vaseTypes.join() !== "reservation.held,reservation.committed,reservation.voided,refund.requested") throw new CheckFailed(`the timeline lists ${vaseTypes.join(", ")}`);
    await expectText(page.locator("#events li").nth(2), `Sale voided (payment pay-${run}-3)`, "the void reads plainly");
    await expectText(page.locator("#events li").nth(3), "sale voided", "the refund names its reason");
    await page.locator("#timeline-close").click();

    say("an extended hold reads plainly in the timeline");
    await expectStatus("POST", `/v1/reservations/${paintingHold.reservation_id}/extend`, { hold_seconds: 2400 }, randomUUID(), [200]);
    await row(painting).locator("button.asset-link").click();
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 2, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline did not list the extension");
    });
    await expectText(page.locator("#events li").nth(1), "Hold of buyer-9051 extended until", "the extension reads plainly");
    await page.locator("#timeline-close").click();

    say("setting when a sale opens from the timeline");
    await row(bell).locator("button.asset-link").click();
    const openingAt = page.getByLabel("Sale opens at", { exact: true });
    await openingAt.waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline offers no opening time");
    });
    const localValue = (offsetMs) =>
      page.evaluate((ms) => {
        const d = new Date(Date.now() + ms);
        const p = (n) => String(n).padStart(2, "0");
        const value = `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
        return { value, iso: new Date(value).toISOString() };
      }, offsetMs);
    const prefilled = await openingAt.inputValue();
    const expectedPrefill = await page.evaluate((iso) => {
      const d = new Date(iso);
      const p = (n) => String(n).padStart(2, "0");
      return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
    }, opensAt);
    if (prefilled !== expectedPrefill) throw new CheckFailed(`the opening time reads ${prefilled}, expected ${expectedPrefill}`);
    const later = await localValue(3 * 24 * 3600 * 1000);
    await openingAt.fill(later.value);
    await page.getByRole("button", { name: "Set the opening time", exact: true }).click();
    await expectText(page.locator("#notice"), "the sale opens at", "the new opening time is confirmed");
    const patched = await expectStatus("GET", `/v1/assets/${bell}`, undefined, undefined, [200]);
    if (Date.parse(patched.available_from) !== Date.parse(later.iso)) throw new CheckFailed(`available_from reads ${patched.available_from}, expected ${later.iso}`);
    await expectText(row(bell).locator(".cell-status time.opens"), "opens ", `${bell} shows its new opening`);
    await page.getByRole("button", { name: "Open now", exact: true }).click();
    await expectText(page.locator("#notice"), "the sale is open", "opening now is confirmed");
    if ((await expectStatus("GET", `/v1/assets/${bell}`, undefined, undefined, [200])).available_from !== null) throw new CheckFailed("Open now left available_from set");
    await page.waitForFunction((id) => !document.querySelector(`#asset-rows tr[data-id="${id}"] time.opens`), bell, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed(`${bell} still shows an opening time after Open now`);
    });
    const soon = await localValue(3 * 3600 * 1000);
    await openingAt.fill(soon.value);
    await page.getByRole("button", { name: "Set the opening time", exact: true }).click();
    await expectText(row(bell).locator(".cell-status time.opens"), "opens in 2 h", `${bell} opens in about three hours`);

    say("prices and attributes on the board");
    await expectText(row(plate).locator(".cell-price"), "15,000,000", `${plate} shows its price`);
    await expectText(row(plate).locator(".cell-price"), "IDR", `${plate} shows its currency`);
    await expectText(row(plate).locator(".cell-name .attrs"), "digits: 3 · premium · region: AB", `${plate} shows its attributes`);
    if ((await row(sofa).locator(".cell-name .attrs").count()) !== 0) throw new CheckFailed("an asset without attributes shows some");

    say("the board lists the ids that start with what is typed");
    await page.locator("#timeline-close").click();
    await page.getByLabel("Id starts with", { exact: true }).fill(`PL-AB1`);
    await page.waitForFunction(
      (id) => {
        const shown = [...document.querySelectorAll("#asset-rows tr")];
        return shown.length === 1 && shown[0].dataset.id === id;
      },
      plate,
      { timeout: WAIT_MS },
    ).catch(async () => {
      const ids = await page.locator("#asset-rows tr").evaluateAll((trs) => trs.map((tr) => tr.dataset.id));
      throw new CheckFailed(`the prefix PL-AB1 shows ${ids.join(", ") || "nothing"}, expected ${plate} alone`);
    });
    await expectText(page.locator("#assets-caption"), "ids starting with “PL-AB1”", "the caption names the prefix");
    if (!requests.some((r) => r.url.pathname === "/v1/assets" && r.url.searchParams.get("id_prefix") === "PL-AB1")) {
      throw new CheckFailed("the prefix was not sent to the API as id_prefix");
    }
    await page.getByLabel("Id starts with", { exact: true }).fill("");
    await row(excavator).waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("clearing the prefix did not bring every asset back");
    });

    say("a held asset's waiting list: its length on the board, its queue in the timeline");
    const queued = `Q-${run}`;
    await expectStatus("POST", "/v1/assets", { id: queued, name: "Plate B 1 Q" }, undefined, [201]);
    await expectStatus("POST", `/v1/assets/${queued}/reservations`, { buyer_id: "buyer-q0", hold_seconds: 600 }, randomUUID(), [201]);
    for (const buyer of ["buyer-q1", "buyer-q2"]) {
      await expectStatus("POST", `/v1/assets/${queued}/waitlist`, { buyer_id: buyer }, randomUUID(), [201]);
    }
    await expectText(row(queued).locator(".cell-status .waiting"), "2 waiting", `${queued} shows two waiting`);
    await row(queued).locator("button.asset-link").click();
    await page.waitForFunction(() => document.querySelectorAll("#queue li").length === 2, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline does not list the two waiters");
    });
    const waiters = await page.locator("#queue li .queue-buyer").allTextContents();
    if (waiters.join() !== "buyer-q1,buyer-q2") throw new CheckFailed(`the queue reads ${waiters.join(", ")}, expected buyer-q1, buyer-q2`);
    await expectText(page.locator("#queue li").nth(0), "1.", "the first waiter is first");
    if (!(await page.locator("#offer-form").isHidden())) throw new CheckFailed("a held asset offers an offer");
    await page.locator("#timeline-close").click();

    say("an offer to a named buyer from the timeline");
    const offered = `OFF-${run}`;
    await expectStatus("POST", "/v1/assets", { id: offered, name: "Plate D 7 OFF", price: { amount: 250000, currency: "EUR" } }, undefined, [201]);
    await row(offered).waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed(`the row of ${offered} did not appear`);
    });
    await row(offered).locator("button.asset-link").click();
    const offerBuyer = page.getByLabel("Buyer", { exact: true });
    await offerBuyer.waitFor({ timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline of an available asset offers no offer form");
    });
    await offerBuyer.fill("applicant-12");
    await page.getByLabel("Storefront", { exact: true }).fill(offerClient);
    const inFiveDays = await localValue(5 * 24 * 3600 * 1000);
    await page.getByLabel("Held until", { exact: true }).fill(inFiveDays.value);
    await page.getByRole("button", { name: "Make the offer", exact: true }).click();
    await expectText(page.locator("#notice"), `${offered} is held for applicant-12`, "the offer is confirmed");
    await expectText(statusOf(offered), "HELD", `${offered} turns HELD`);
    const offer = (await expectStatus("GET", `/v1/reservations?asset_id=${offered}&status=HELD`, undefined, undefined, [200])).items?.[0];
    if (!offer || offer.via !== "offer" || offer.buyer_id !== "applicant-12" || Date.parse(offer.expires_at) !== Date.parse(inFiveDays.iso)) {
      throw new CheckFailed(`the offer's hold reads ${JSON.stringify(offer)}`);
    }
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 1, null, { timeout: WAIT_MS }).catch(() => {
      throw new CheckFailed("the timeline did not list the offer");
    });
    await expectText(page.locator("#events li").nth(0), "Offered to applicant-12", "the offer reads plainly in the timeline");

    say("accessibility basics");
    const a11y = await page.evaluate(() => {
      const issues = [];
      const name = (el) =>
        (el.getAttribute("aria-label") ||
          (el.getAttribute("aria-labelledby") || "")
            .split(/\s+/)
            .map((id) => document.getElementById(id)?.textContent ?? "")
            .join(" ") ||
          Array.from(el.labels ?? [], (l) => l.textContent).join(" ") ||
          el.textContent ||
          el.getAttribute("title") ||
          "").trim();
      for (const el of document.querySelectorAll("input, select, textarea")) {
        if (el.type === "hidden") continue;
        if (!name(el)) issues.push(`an ${el.tagName.toLowerCase()}#${el.id} has no label`);
      }
      for (const el of document.querySelectorAll("button")) {
        if (!name(el)) issues.push(`a button has no accessible name: ${el.outerHTML.slice(0, 80)}`);
      }
      if (!document.documentElement.lang) issues.push("<html> has no lang");
      if (document.querySelectorAll("h1").length !== 1) issues.push("the page has not exactly one h1");
      const table = document.querySelector("table");
      if (!table?.querySelector("caption")?.textContent.trim()) issues.push("the table has no caption");
      for (const th of table?.querySelectorAll("thead th") ?? []) if (th.scope !== "col") issues.push(`column header "${th.textContent}" lacks scope=col`);
      if (document.querySelectorAll("div[onclick], span[onclick]").length > 0) issues.push("clickable divs");
      return issues;
    });
    if (a11y.length > 0) throw new CheckFailed(`accessibility: ${a11y.join("; ")}`);

    // The keyboard reaches the asset buttons, with a visible focus; Enter
    // opens the timeline, Escape closes it and focus returns to the button.
    await page.locator("#timeline-close").click();
    await timeline.waitFor({ state: "hidden", timeout: WAIT_MS });
    await page.locator("body").click({ position: { x: 1, y: 1 } });
    await page.evaluate(() => document.activeElement?.blur());
    let reached = null;
    for (let i = 0; i < 80 && !reached; i += 1) {
      await page.keyboard.press("Tab");
      reached = await page.evaluate(() => {
        const el = document.activeElement;
        if (!el?.classList.contains("asset-link") || !el.closest("#asset-rows")) return null;
        const style = getComputedStyle(el);
        return { id: el.textContent, outline: style.outlineStyle, width: parseFloat(style.outlineWidth) };
      });
    }
    if (!reached) throw new CheckFailed("Tab never reached an asset button of the board");
    if (reached.outline === "none" || !(reached.width >= 2)) throw new CheckFailed(`the focused asset button shows no focus ring (${reached.outline} ${reached.width}px)`);
    await page.keyboard.press("Enter");
    await expectText(page.locator("#timeline-heading"), reached.id, "Enter on a focused asset opens its timeline");
    await page.keyboard.press("Escape");
    await timeline.waitFor({ state: "hidden", timeout: WAIT_MS });
    const back = await page.evaluate(() => document.activeElement?.textContent);
    if (back !== reached.id) throw new CheckFailed(`closing the timeline left focus on "${back}", expected the ${reached.id} button`);

    say("desktop screenshot");
    await row(excavator).locator("button.asset-link").click();
    await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 2, null, { timeout: WAIT_MS });
    await page.evaluate(() => window.scrollTo(0, 0));
    await mkdir(shotDir, { recursive: true });
    await page.waitForTimeout(300);
    await page.screenshot({ path: path.join(shotDir, "console.png") });

    say("phone-sized screenshot");
    await page.setViewportSize({ width: 375, height: 812 });
    await page.waitForTimeout(500);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    if (overflow > 1) throw new CheckFailed(`at 375 px the page scrolls sideways by ${overflow} px`);
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(shotDir, "console-phone.png") });
    await page.setViewportSize({ width: 1280, height: 800 });

    say("no polling while the tab is hidden");
    await page.evaluate(() => {
      Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
      Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
      document.dispatchEvent(new Event("visibilitychange"));
    });
    await page.waitForTimeout(1_500); // a poll already under way may finish
    const hiddenFrom = Date.now();
    await page.waitForTimeout(2_500);
    const whileHidden = requests.filter((r) => r.at >= hiddenFrom && r.url.pathname.startsWith("/v1/")).length;
    if (whileHidden > 0) throw new CheckFailed(`${whileHidden} API requests while the tab was hidden`);
    await page.evaluate(() => {
      delete document.hidden;
      delete document.visibilityState;
      document.dispatchEvent(new Event("visibilitychange"));
    });
    const shownAgain = Date.now();
    await page.waitForFunction(() => document.getElementById("live-state")?.dataset.state === "ok", null, { timeout: WAIT_MS });
    if (!requests.some((r) => r.at >= shownAgain && r.url.pathname === "/v1/assets")) throw new CheckFailed("polling did not resume when the tab was shown");

    say("final checks");
    if (!(await page.evaluate(() => window.__sameDocument === true)) || navigations !== 1) {
      throw new CheckFailed(`the page reloaded (${navigations} navigations)`);
    }
    if (foreign.size > 0) throw new CheckFailed(`the page requested other origins than ${origin} (it must work offline):\n  ${[...foreign].join("\n  ")}`);
    // Refusals the check provoked: a second asset with one id, and withdrawing the stale vase.
    const provoked = (r) => r.startsWith("409 POST") && (r.endsWith("/v1/assets") || r.endsWith(`/v1/assets/${vase}/withdraw`));
    const unexpected = failedResponses.filter((r) => !provoked(r));
    if (unexpected.length > 0) throw new CheckFailed(`failed responses:\n  ${unexpected.join("\n  ")}`);
    // Logged for the refusals above and for the void attempt that got no answer.
    const realProblems = problems.filter((p) => !/409 \(Conflict\)|net::ERR_CONNECTION_RESET/.test(p));
    if (realProblems.length > 0) throw new CheckFailed(`the page reported:\n  ${realProblems.join("\n  ")}`);

    return `console OK against ${base}: prices and attributes shown, the board filtered by id prefix, two waiters shown in order, an offer made from the page (HELD via offer), rows turned HELD (countdown ${first}s then ${second}s), SOLD, WITHDRAWN and AVAILABLE again without a reload, a held asset withdrawn after confirming (hold RELEASED), conflicts explained, a sale voided with one Idempotency-Key across a retry, opening times shown and set, refunds and timelines shown, ${requests.length} requests all to ${origin}, screenshots in ${shotDir}`;
  } finally {
    await browser.close();
  }
}

async function expectText(locator, text, what) {
  try {
    await locator.filter({ hasText: text }).first().waitFor({ timeout: WAIT_MS });
  } catch {
    const shown = await locator.first().textContent().catch(() => "(nothing)");
    throw new CheckFailed(`${what}: expected "${text}", the page shows "${(shown ?? "").trim()}"`);
  }
}
