// The storefront in headless Chromium, two buyers in two browser contexts:
//
//   1. buyer one holds plate 2 and pays late (the provider waits for the hold
//      to lapse): the page ends up showing the refund;
//   2. both buyers click Hold on plate 1 at once: exactly one wins and sees
//      its countdown running; the other sees it held and joins the queue at 1;
//   3. a tab of the winner opened before the race and not refreshed since
//      still offers Hold: clicking it answers "you already held this";
//   4. the winner releases: the loser's page shows plate 1 as its own, handed
//      over from the waiting list; it pays, and both pages read it sold;
//   5. a screenshot of buyer one's page.
//
// Every wait is for a condition, with a deadline.
//
//   STOREFRONT_URL=http://127.0.0.1:18321 PLATE_PREFIX=ZK4Q HOLD_SECONDS=15 \
//   SCREENSHOT_DIR=target node --import tsx test/e2e.ts

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium, type Browser, type BrowserContext, type Locator, type Page } from "playwright-core";

class Failure extends Error {}

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback;
  if (value === undefined || value === "") throw new Failure(`set ${name}`);
  return value;
};

const baseUrl = env("STOREFRONT_URL").replace(/\/+$/, "");
const prefix = env("PLATE_PREFIX");
const holdSeconds = Number(env("HOLD_SECONDS"));
const screenshotDir = env("SCREENSHOT_DIR", "target");
const [racePlate, latePlate, otherPlate] = [`${prefix}1`, `${prefix}2`, `${prefix}3`];

const row = (page: Page, plate: string): Locator => page.locator(`tr[data-testid="plate"][data-plate-id="${plate}"]`);

async function within(ms: number, what: string, wait: (timeout: number) => Promise<unknown>): Promise<void> {
  try {
    await wait(ms);
  } catch (err) {
    const detail = err instanceof Error ? err.message.split("\n")[0] : String(err);
    throw new Failure(`${what}: not within ${ms} ms (${detail})`);
  }
}

const rowIn = (page: Page, plate: string, states: string[], ms: number, who: string): Promise<void> =>
  within(ms, `${who}: ${plate} shows ${states.join(" or ")}`, (timeout) =>
    page.locator(states.map((s) => `tr[data-plate-id="${plate}"][data-state="${s}"]`).join(", ")).waitFor({ timeout }),
  );

// The note under a plate says how the buyer's last click on it ended ("pending" while it runs).
const noteOf = (page: Page, plate: string): Locator =>
  row(page, plate).locator('[data-testid="plate-note"][data-outcome]:not([data-outcome="pending"])');

async function outcomeOf(page: Page, plate: string, ms: number, who: string): Promise<string> {
  await within(ms, `${who}: the outcome of the click on ${plate}`, (timeout) => noteOf(page, plate).waitFor({ timeout }));
  return (await noteOf(page, plate).getAttribute("data-outcome")) ?? "";
}

async function openStorefront(context: BrowserContext, errors: string[], who: string): Promise<Page> {
  const page = await context.newPage();
  page.on("pageerror", (err) => errors.push(`${who}: ${err.message}`));
  await page.goto(baseUrl);
  return page;
}

async function openStaleTab(context: BrowserContext, errors: string[], who: string): Promise<Page> {
  const page = await context.newPage();
  page.on("pageerror", (err) => errors.push(`${who}: ${err.message}`));
  let firstList: string | null = null;
  let thawed = false;
  page.on("request", (request) => {
    if (request.method() === "POST") thawed = true;
  });
  await page.route(
    (url) => url.pathname === "/api/plates",
    async (route) => {
      if (!thawed && firstList !== null) {
        await route.fulfill({ status: 200, contentType: "application/json", body: firstList });
        return;
      }
      const response = await route.fetch();
      const body = await response.text();
      if (!thawed) firstList = body;
      await route.fulfill({ response, body });
    },
  );
  await page.goto(`${baseUrl}/?prefix=${prefix}`);
  await rowIn(page, racePlate, ["available"], 5000, who);
  return page;
}

async function search(page: Page, who: string): Promise<void> {
  await page.getByTestId("search-input").fill(prefix.toLowerCase());
  await page.getByTestId("search-input").press("Enter");
  await within(5000, `${who}: the search for ${prefix} lists its plates`, (timeout) => row(page, otherPlate).waitFor({ timeout }));
}

async function run(browser: Browser, pages: Page[], errors: string[]): Promise<void> {
  const contexts = [await browser.newContext(), await browser.newContext()] as const;
  const buyers = [await openStorefront(contexts[0], errors, "buyer 1"), await openStorefront(contexts[1], errors, "buyer 2")] as const;
  pages.push(...buyers);
  await Promise.all(buyers.map((page, i) => search(page, `buyer ${i + 1}`)));

  // Second tabs, opened now while plate 1 is still available: each keeps
  // showing the list it first got (its polls are answered with it) until it
  // sends a POST, as a tab left open would look.
  const staleTabs: Page[] = [];
  for (const [i, context] of contexts.entries()) {
    staleTabs.push(await openStaleTab(context, errors, `buyer ${i + 1}, second tab`));
  }
  pages.push(...staleTabs);
  // A tab in the background of its window gets clicks late (Chromium slows
  // its frames): the buyers look at their first tabs again.
  for (const page of buyers) await page.bringToFront();

  // 1. A late payment, left running while the rest goes on.
  const [one, two] = buyers;
  await row(one, latePlate).getByTestId("hold-button").click();
  await rowIn(one, latePlate, ["mine"], 5000, "buyer 1");
  await row(one, latePlate).getByTestId("pay-late-button").click();

  // 2. The race.
  await Promise.all(buyers.map((page) => row(page, racePlate).getByTestId("hold-button").click()));
  const outcomes = await Promise.all(buyers.map((page, i) => outcomeOf(page, racePlate, 5000, `buyer ${i + 1}`)));
  const winnerIndex = outcomes.indexOf("held");
  if (winnerIndex === -1 || outcomes.filter((o) => o === "held").length !== 1 || !outcomes.includes("unavailable")) {
    throw new Failure(`the race: expected one "held" and one "unavailable", got ${JSON.stringify(outcomes)}`);
  }
  const winner = buyers[winnerIndex] ?? one;
  const loser = buyers[1 - winnerIndex] ?? two;
  const staleWinnerTab = staleTabs[winnerIndex] ?? one;
  console.log(`storefront e2e: buyer ${winnerIndex + 1} won the race for ${racePlate}`);

  await rowIn(winner, racePlate, ["mine"], 5000, "winner");
  await within(3000, "winner: 'You hold this'", (timeout) => row(winner, racePlate).getByTestId("you-hold").waitFor({ timeout }));
  const countdown = row(winner, racePlate).getByTestId("countdown");
  const first = (await countdown.textContent()) ?? "";
  if (!/^\d+:\d{2}$/.test(first) || first === "0:00") throw new Failure(`winner: countdown reads ${JSON.stringify(first)}`);
  await within(3000, "winner: the countdown runs", (timeout) =>
    winner.waitForFunction(
      ([plate, before]) => document.querySelector(`tr[data-plate-id="${plate}"] [data-testid="countdown"]`)?.textContent !== before,
      [racePlate, first] as const,
      { timeout },
    ),
  );

  await rowIn(loser, racePlate, ["held"], 5000, "loser");
  await within(3000, "loser: a countdown on the held plate", (timeout) =>
    row(loser, racePlate).getByTestId("countdown").waitFor({ timeout }),
  );
  await row(loser, racePlate).getByTestId("join-button").click();
  await rowIn(loser, racePlate, ["queued"], 5000, "loser");
  const position = await row(loser, racePlate).getByTestId("queue-position").textContent();
  if (position !== "1") throw new Failure(`loser: queue position ${JSON.stringify(position)}, expected "1"`);

  // 3. The winner's stale tab holds again: its own hold, 200.
  await staleWinnerTab.bringToFront();
  await row(staleWinnerTab, racePlate).getByTestId("hold-button").click();
  const again = await outcomeOf(staleWinnerTab, racePlate, 5000, "winner, second tab");
  if (again !== "held") throw new Failure(`winner, second tab: outcome ${JSON.stringify(again)}, expected "held"`);
  await rowIn(staleWinnerTab, racePlate, ["mine"], 5000, "winner, second tab");
  const noteText = (await noteOf(staleWinnerTab, racePlate).textContent()) ?? "";
  if (!noteText.includes("already held")) throw new Failure(`winner, second tab: note ${JSON.stringify(noteText)}`);
  await within(3000, "winner, second tab: 'You hold this'", (timeout) =>
    row(staleWinnerTab, racePlate).getByTestId("you-hold").waitFor({ timeout }),
  );

  // 4. The winner releases; the queue hands the plate to the loser.
  await winner.bringToFront();
  await row(winner, racePlate).getByTestId("release-button").click();
  const released = await outcomeOf(winner, racePlate, 5000, "winner");
  if (released !== "released") {
    throw new Failure(`winner: release outcome ${JSON.stringify(released)} (${await noteOf(winner, racePlate).textContent()})`);
  }
  await rowIn(loser, racePlate, ["mine"], 10_000, "loser after the release");
  const handed = (await row(loser, racePlate).getByTestId("plate-status").textContent()) ?? "";
  if (!handed.includes("You hold this") || !handed.includes("waiting list")) {
    throw new Failure(`loser: status reads ${JSON.stringify(handed)}`);
  }
  await within(3000, "loser: the hand-off announced", (timeout) =>
    loser.getByTestId("message").filter({ hasText: "handed to you" }).waitFor({ timeout }),
  );
  await row(loser, racePlate).getByTestId("pay-button").click();
  await rowIn(loser, racePlate, ["bought"], 10_000, "loser after paying");
  await rowIn(winner, racePlate, ["sold"], 5000, "winner after the sale");

  // 1, continued: the late payment comes back refunded.
  await within(holdSeconds * 1000 + 30_000, "buyer 1: 'payment refunded' after the late payment", (timeout) =>
    row(one, latePlate).getByTestId("payment-result").filter({ hasText: /^payment refunded: .*HOLD_EXPIRED/ }).waitFor({ timeout }),
  );

  // 5. Buyer two holds plate 3, so buyer one's page shows another's countdown too.
  await row(two, otherPlate).getByTestId("hold-button").click();
  await rowIn(one, otherPlate, ["held"], 5000, "buyer 1");
  mkdirSync(screenshotDir, { recursive: true });
  await one.setViewportSize({ width: 1100, height: 560 });
  await one.screenshot({ path: join(screenshotDir, "storefront.png"), fullPage: true });
}

const started = Date.now();
const errors: string[] = [];
const pages: Page[] = [];
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true });
try {
  await run(browser, pages, errors);
  if (errors.length > 0) throw new Failure(`errors in the page:\n  ${errors.join("\n  ")}`);
  console.log(`storefront e2e: PASSED in ${((Date.now() - started) / 1000).toFixed(1)} s; screenshot ${join(screenshotDir, "storefront.png")}`);
} catch (err) {
  console.error(`storefront e2e: FAILED after ${((Date.now() - started) / 1000).toFixed(1)} s: ${err instanceof Error ? err.message : String(err)}`);
  if (!(err instanceof Failure) && err instanceof Error && err.stack) console.error(err.stack);
  mkdirSync(screenshotDir, { recursive: true });
  for (const [i, page] of pages.entries()) {
    await page.screenshot({ path: join(screenshotDir, `storefront-failure-${i + 1}.png`), fullPage: true }).catch(() => {});
  }
  process.exitCode = 1;
} finally {
  await browser.close();
}
