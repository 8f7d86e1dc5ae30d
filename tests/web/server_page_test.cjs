// kiln serve's page at / in headless chromium: it lists the model, a job's
// progress bar moves, its live preview shows, and the image lands in the gallery with its parameters;
// a second job is cancelled from its button. Exits non-zero on any failure.
"use strict";
const { spawn } = require("child_process");
const path = require("path");
const { chromium } = require("playwright-core");

const [kilnBin, chromiumPath, workDir] = process.argv.slice(2);

function startServer() {
  // The default model (models/kiln-tiny.gguf), one thread.
  const server = spawn(kilnBin, ["serve", "--listen-port", "0", "-t", "1", "--max-steps", "5000"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    let out = "";
    server.stdout.on("data", (chunk) => {
      out += chunk;
      const match = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (match) resolve({ server, port: Number(match[1]) });
    });
    server.on("exit", (code) => reject(new Error("kiln serve exited with " + code + " before listening")));
  });
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

// The server, so that a failure anywhere still stops it: left running, it
// would hold the test runner's output pipe open and ctest would wait forever.
let runningServer = null;

async function main() {
  const { server, port } = await startServer();
  runningServer = server;
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
    const failures = [];
    page.on("pageerror", (e) => failures.push(e.message));
    page.on("requestfailed", (r) => { if (!r.url().includes("/events")) failures.push("request failed: " + r.url()); });
    await page.goto("http://127.0.0.1:" + port + "/");
    // The page fills its lists from separate requests, which may answer in any order.
    await page.waitForFunction(() => document.getElementById("model").options.length > 0 &&
                                     document.getElementById("sampler").options.length > 5, null, { timeout: 60000 })
      .catch(() => {});
    check((await page.inputValue("#model")) === "kiln-tiny.gguf", "the model list lacks kiln-tiny.gguf");
    check((await page.locator("#sampler option").count()) > 5, "no samplers listed");

    // A job long enough that the bar is seen part-way.
    await page.fill("#width", "64");
    await page.fill("#height", "64");
    await page.fill("#steps", "300");
    await page.fill("#seed", "11");
    await page.click("#generate");
    await page.waitForFunction(() => {
      const v = document.getElementById("progress").value;
      return v > 0 && v < 1;
    }, null, { polling: "raf", timeout: 120000 });
    // The live preview (the server's default, proj) is shown from the step events.
    await page.waitForFunction(() => document.getElementById("preview").src.startsWith("data:image/png;base64,"),
                               null, { polling: "raf", timeout: 120000 });
    check((await page.textContent("#preview-caption")).startsWith("live preview: image 1, step "),
          "the live preview has no caption");
    await page.waitForSelector("#gallery figure", { timeout: 120000 });
    check(await page.locator("#live").isHidden(), "the live preview stays after the job");
    check((await page.textContent("#status")) === "done", "status is not 'done'");
    const caption = await page.textContent("#gallery figcaption");
    check(caption.includes("Steps: 300") && caption.includes("Seed: 11") && caption.includes("Size: 64x64"),
          "the gallery's parameters are wrong: " + caption);
    const href = await page.getAttribute("#gallery a", "href");
    check(href.startsWith("data:image/png;base64,") && (await page.getAttribute("#gallery a", "download")).endsWith(".png"),
          "no PNG download link");

    // A second job, cancelled from the page.
    await page.fill("#steps", "4000");
    await page.click("#generate");
    await page.waitForFunction(() => document.getElementById("progress").value > 0 &&
                                     !document.getElementById("cancel").disabled, null, { polling: "raf", timeout: 120000 });
    await page.click("#cancel");
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("cancelled"), null,
                               { timeout: 120000 });
    check((await page.locator("#gallery figure").count()) === 1, "the cancelled job added an image");
    await page.screenshot({ path: path.join(workDir, "server_page.png"), fullPage: true });
    check(failures.length === 0, "page errors: " + failures.join("; "));
  } finally {
    await browser.close();
  }
  const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));
  server.kill("SIGTERM");
  const code = await exited;
  runningServer = null;
  check(code === 0, "kiln serve exited with " + code + " on SIGTERM");
  console.log("web page test passed; screenshot: " + path.join(workDir, "server_page.png"));
}

main().catch((e) => {
  console.error("web page test failed: " + e.message);
  if (runningServer) runningServer.kill("SIGKILL");
  process.exit(1);
});
