// The interactive docs as a person sees them: headless Chromium opens /docs,
// waits for Swagger UI, checks that every operation of /openapi.json is on the
// page and that nothing was fetched from any other host, then saves a
// full-page screenshot.
//
//   HOLDFAST_URL=http://127.0.0.1:8080 [SCREENSHOT=target/docs.png] node docs.mjs
//
// SCREENSHOT, when relative, is taken from the repository root.

import { mkdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
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
const HTTP_METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
const RENDER_TIMEOUT_MS = 30_000;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const screenshotPath = path.resolve(repoRoot, process.env.SCREENSHOT || path.join("target", "docs.png"));

class CheckFailed extends Error {}

const rawBase = (process.env.HOLDFAST_URL ?? "").trim().replace(/\/+$/, "");
if (rawBase === "") {
  console.error("docs: set HOLDFAST_URL, e.g. HOLDFAST_URL=http://127.0.0.1:8080");
  process.exit(2);
}

try {
  console.log(await checkDocs(rawBase));
} catch (err) {
  const cause = err instanceof CheckFailed || err?.cause === undefined ? "" : `\n(cause: ${String(err.cause)})`;
  console.error(`docs check FAILED against ${rawBase}: ${err instanceof CheckFailed ? err.message : (err?.stack ?? String(err))}${cause}`);
  process.exitCode = 1;
}

/** "GET /v1/assets" for every operation in the document. */
function documentOperations(doc) {
  const ops = [];
  for (const [opPath, item] of Object.entries(doc.paths ?? {})) {
    for (const method of HTTP_METHODS) {
      const op = item?.[method];
      if (op) ops.push({ key: `${method.toUpperCase()} ${opPath}`, operationId: op.operationId ?? null, tags: op.tags ?? [] });
    }
  }
  return ops;
}

async function checkDocs(base) {
  const origin = new URL(base).origin;

  // The document the page is meant to show.
  const docResponse = await fetch(`${base}/openapi.json`);
  if (!docResponse.ok) throw new CheckFailed(`GET ${base}/openapi.json answered ${docResponse.status}`);
  const doc = await docResponse.json();
  const expected = documentOperations(doc);
  if (expected.length === 0) throw new CheckFailed("/openapi.json lists no operations");

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS, headless: true });
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, serviceWorkers: "block" });
    const page = await context.newPage();

    // Every request the page makes: same-origin ones go through, anything else
    // is recorded and refused, so the check proves the page works offline.
    const foreign = new Set();
    let requests = 0;
    await context.route("**/*", (route) => {
      const url = route.request().url();
      requests += 1;
      if (new URL(url).origin === origin) return route.continue();
      foreign.add(url);
      return route.abort("blockedbyclient");
    });
    // Requests that never reach the router (data:, blob:) are local by nature;
    // count any other scheme that shows up as foreign.
    page.on("request", (request) => {
      const url = request.url();
      if (!/^(data|blob|about):/.test(url) && new URL(url).origin !== origin) foreign.add(url);
    });
    const pageErrors = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));

    const response = await page.goto(`${base}/docs`, { waitUntil: "load" });
    if (!response || !response.ok()) throw new CheckFailed(`GET ${base}/docs ended with ${response ? response.status() : "no response"}`);
    const finalUrl = new URL(page.url());
    if (finalUrl.origin !== origin || finalUrl.pathname !== "/docs/") {
      throw new CheckFailed(`GET ${base}/docs landed on ${page.url()}, expected ${origin}/docs/`);
    }

    // Swagger UI has rendered when the operation blocks stop appearing: at
    // least one per operation (an operation with several tags shows up once per tag).
    await page.waitForSelector("#swagger-ui .opblock", { timeout: RENDER_TIMEOUT_MS }).catch(() => {
      throw new CheckFailed(`Swagger UI rendered no operation within ${RENDER_TIMEOUT_MS / 1000}s`);
    });
    await page
      .waitForFunction((n) => document.querySelectorAll("#swagger-ui .opblock").length >= n, expected.length, { timeout: RENDER_TIMEOUT_MS })
      .catch(() => {}); // a shortfall is reported below, operation by operation
    await page.waitForLoadState("networkidle");

    const shown = await page.$$eval("#swagger-ui .opblock", (blocks) =>
      blocks.map((block) => ({
        id: block.id,
        method: (block.querySelector(".opblock-summary-method")?.textContent ?? "").trim().toUpperCase(),
        path: block.querySelector(".opblock-summary-path")?.getAttribute("data-path") ?? "",
      })),
    );
    const shownKeys = new Set(shown.map((s) => `${s.method} ${s.path}`));
    const shownIds = new Set(shown.map((s) => s.id));
    // Swagger UI's block id for a tagged operation with an operationId:
    // operations-<tag>-<operationId>, each part with blanks as "_" and CSS-escaped.
    const blockIds = await page.evaluate((ops) => {
      const part = (s) => CSS.escape(s.trim().replace(/\s/g, "_"));
      return ops.map((op) => (op.operationId ? op.tags.map((tag) => `operations-${part(tag)}-${part(op.operationId)}`) : []));
    }, expected);

    const missing = [];
    for (const [i, op] of expected.entries()) {
      if (!shownKeys.has(op.key)) {
        missing.push(`${op.key}${op.operationId ? ` (${op.operationId})` : ""}`);
        continue;
      }
      for (const id of blockIds[i]) {
        if (!shownIds.has(id)) missing.push(`${op.key}: no block #${id}`);
      }
    }

    await mkdir(path.dirname(screenshotPath), { recursive: true });
    await page.screenshot({ path: screenshotPath, fullPage: true });

    // What a reader meets on opening an operation: Swagger UI resolves each
    // operation's $refs only then, and lists what it cannot resolve in its
    // "Errors" box. Open every operation, then read that box.
    const toggles = page.locator("#swagger-ui .opblock .opblock-summary-control");
    const toggleCount = await toggles.count();
    for (let i = 0; i < toggleCount; i += 1) await toggles.nth(i).click();
    await page
      .waitForFunction((n) => document.querySelectorAll("#swagger-ui .opblock .opblock-body").length >= n, toggleCount, { timeout: RENDER_TIMEOUT_MS })
      .catch(() => {
        throw new CheckFailed(`opening the ${toggleCount} operations did not show their details within ${RENDER_TIMEOUT_MS / 1000}s`);
      });
    await page.waitForLoadState("networkidle");
    await page.waitForTimeout(1_000); // subtree resolution is debounced
    const errorsBox = await page.$$eval("#swagger-ui .errors-wrapper .error-wrapper", (items) =>
      items.map((item) => item.textContent.replace(/\s+/g, " ").trim()),
    );

    const problems = [];
    if (missing.length > 0) problems.push(`${missing.length} of ${expected.length} operations not shown on the page:\n  ${missing.join("\n  ")}`);
    if (foreign.size > 0) problems.push(`the page requested hosts other than ${origin} (it must work offline):\n  ${[...foreign].join("\n  ")}`);
    if (pageErrors.length > 0) problems.push(`the page threw:\n  ${pageErrors.join("\n  ")}`);
    if (errorsBox.length > 0) {
      const distinct = [...new Set(errorsBox)];
      const listed = distinct.slice(0, 10);
      const more = distinct.length > listed.length ? `\n  ... and ${distinct.length - listed.length} more distinct` : "";
      problems.push(`Swagger UI shows ${errorsBox.length} errors once the operations are opened (${distinct.length} distinct):\n  ${listed.join("\n  ")}${more}`);
    }
    if (problems.length > 0) throw new CheckFailed(`${problems.join("\n")}\n(screenshot: ${screenshotPath})`);

    return `docs OK against ${base}: all ${expected.length} operations shown (${shown.length} blocks) and open without errors, ${requests} requests all to ${origin}, screenshot ${screenshotPath}`;
  } finally {
    await browser.close();
  }
}
