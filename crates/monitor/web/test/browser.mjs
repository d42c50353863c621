// Drives the dashboard in the distribution's Chromium (headless, through playwright-core; no
// downloaded browser): prints the nodes' colors, clicks the first link on the map and counts
// the chart's points, saves a screenshot. Usage: node browser.mjs URL SCREENSHOT [LINK], LINK
// being `feed|publisher|subscriber` (default: the first link drawn).
import { chromium } from "playwright-core";

const [url, screenshot, link] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage({ viewport: { width: 1500, height: 900 } });
  const errors = [];
  page.on("pageerror", (error) => errors.push(error.message));
  page.on("console", (message) => { if (message.type() === "error") errors.push(message.text()); });
  await page.goto(url);
  await page.waitForSelector("circle.node", { timeout: 20000 });
  const nodes = await page.$$eval("circle.node", (circles) =>
    circles.map((circle) => [circle.dataset.name, circle.getAttribute("class").replace("node ", "")]));
  await page.click(link ? `line.link[data-link="${link}"]` : "line.link");
  await page.waitForSelector("#chart circle.point", { timeout: 20000 });
  const points = await page.$$eval("#chart circle.point", (circles) => circles.length);
  const title = await page.textContent("#chart-title");
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ nodes: Object.fromEntries(nodes), points, title, errors }));
} finally {
  await browser.close();
}
