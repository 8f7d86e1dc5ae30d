// kiln serve's page at / in headless chromium, used as a person would:
//   - it lists the model with its defaults and its plan, the samplers and the LoRAs;
//   - a text-to-image job with a LoRA picked and a hires fix: the bar moves,
//     the live preview shows, the image lands with its parameters;
//   - an inpaint job: an init image is chosen, a mask painted on it, and
//     the job runs with it, seamless across its left and right edges;
//   - two long jobs: the queued one is cancelled from the queue, then the running one;
//   - after a reload the gallery (the server's --output-dir) holds the
//     finished images, and "use these settings" fills the form from one
//     (its seams included).
// Screenshots of the main views are left in WORK_DIR (docs/images/web/
// holds copies). Exits non-zero on any failure.
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const [kilnBin, chromiumPath, workDir] = process.argv.slice(2);
const outputDir = path.join(workDir, "outputs");
// A tiny SD1 model the LoRAs of tests/golden/lora fit, with its tokenizer.
const tinyModel = path.join(__dirname, "..", "golden", "models", "sd1_tiny.safetensors");
const tokenizer = path.join(__dirname, "..", "fixtures", "tiny_tokenizer");
const loraDir = path.join(__dirname, "..", "golden", "lora");
const long = { timeout: 180000 };

function startServer() {
  const server = spawn(kilnBin, ["serve", "--listen-port", "0", "-t", "1", "--max-steps", "5000",
                                 "-m", tinyModel, "--tokenizer", tokenizer,
                                 "--output-dir", outputDir, "--lora-model-dir", loraDir], {
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
// What the test was doing, for the failure message; the page at that moment is saved as failure.png.
let stage = "starting";
let openPage = null;

async function waitForProgress(page) {
  await page.waitForFunction(() => {
    const v = document.getElementById("progress").value;
    return v > 0 && v < 1;
  }, null, Object.assign({ polling: "raf" }, long));
}

async function main() {
  fs.rmSync(outputDir, { recursive: true, force: true });
  const { server, port } = await startServer();
  runningServer = server;
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    openPage = page;
    const failures = [];
    page.on("pageerror", (e) => failures.push(e.message));
    // A poll the test's own reload cuts off (net::ERR_ABORTED) is no page error.
    let reloading = false;
    page.on("requestfailed", (r) => {
      if (reloading && (r.failure() || {}).errorText === "net::ERR_ABORTED") return;
      if (!r.url().includes("/events")) failures.push("request failed: " + r.url());
    });
    await page.goto("http://127.0.0.1:" + port + "/");

    stage = "the model's defaults and plan";
    // The model with its defaults (SD1.x's: 512x512, 20 steps, CFG 7) and its plan.
    await page.waitForSelector("#fit.yes", long);
    check((await page.inputValue("#model")) === "sd1_tiny.safetensors", "the model list lacks sd1_tiny.safetensors");
    check((await page.inputValue("#width")) === "512" && (await page.inputValue("#steps")) === "20" &&
          (await page.inputValue("#cfg")) === "7", "the form does not hold the model's defaults");
    check((await page.textContent("#fit")) === "fits", "the plan badge does not say the job fits");
    await page.click("#fit");
    check((await page.textContent("#plan-report")).includes("fits: yes"), "the plan report is not kiln plan's");
    await page.click("#plan-close");
    check((await page.locator("#sampler option").count()) > 5, "no samplers listed");

    stage = "text to image with a LoRA and hires";
    // Text to image, with a LoRA from the picker and a hires fix.
    await page.selectOption("#lora", "sd1_lora_kohya");
    await page.fill("#lora-weight", "0.5");
    await page.click("#lora-add");
    check((await page.inputValue("#prompt")).endsWith("<lora:sd1_lora_kohya:0.5>"), "the LoRA tag was not added");
    check((await page.textContent("#lora-chips")).includes("sd1_lora_kohya"), "no LoRA chip");
    await page.fill("#width", "64");
    await page.fill("#height", "64");
    await page.fill("#steps", "300");
    await page.fill("#seed", "11");
    await page.check("#hires");
    await page.fill("#hires-scale", "1.5");
    await page.fill("#hires-steps", "20");
    await page.click("#generate");
    await waitForProgress(page);
    // The live preview (the server's default, proj) is shown from the step events.
    await page.waitForFunction(() => document.getElementById("preview").src.startsWith("data:image/png;base64,"),
                               null, Object.assign({ polling: "raf" }, long));
    check((await page.textContent("#preview-caption")).startsWith("live preview: image 1, step "),
          "the live preview has no caption");
    await page.screenshot({ path: path.join(workDir, "web_running.png") });
    await page.waitForSelector("#results img", long);
    await page.waitForSelector("#gallery figure", long);
    check((await page.textContent("#status")) === "done", "status is not 'done'");
    const first = await page.getAttribute("#results img", "alt");
    check(first.includes("Steps: 300") && first.includes("Seed: 11") && first.includes("Hires upscale: 1.5") &&
          first.includes("<lora:sd1_lora_kohya:0.5>"), "the result's parameters are wrong: " + first);
    check(await page.evaluate(() => document.querySelector("#results img").naturalWidth) === 96,
          "the hires fix did not make a 96 px image");
    // The device books show what the loaded model holds.
    await page.waitForFunction(() => document.getElementById("books").textContent.startsWith("CPU: "), null, long);
    await page.screenshot({ path: path.join(workDir, "web_txt2img.png") });

    stage = "inpainting";
    // Inpainting: an init image, a mask painted on it.
    await page.click("#tab-img2img");
    const initPng = await page.evaluate(() => {
      const c = document.createElement("canvas");
      c.width = c.height = 64;
      const g = c.getContext("2d");
      g.fillStyle = "#fff";
      g.fillRect(0, 0, 64, 64);
      g.fillStyle = "#c00";
      g.beginPath();
      g.arc(32, 32, 20, 0, 7);
      g.fill();
      return c.toDataURL("image/png").split(",")[1];
    });
    await page.setInputFiles("#init", { name: "init.png", mimeType: "image/png", buffer: Buffer.from(initPng, "base64") });
    await page.waitForSelector("#paint.shown", long);
    const box = await page.locator("#mask-canvas").boundingBox();
    await page.mouse.move(box.x + box.width * 0.25, box.y + box.height * 0.5);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * 0.75, box.y + box.height * 0.5, { steps: 8 });
    await page.mouse.up();
    const painted = await page.evaluate(() => {
      const c = document.getElementById("mask-canvas");
      const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 3; i < data.length; i += 4) n += data[i] > 0 ? 1 : 0;
      return { n, total: c.width * c.height };
    });
    check(painted.n > 100 && painted.n < painted.total, "the painted mask covers " + painted.n + " of " + painted.total + " pixels");
    await page.screenshot({ path: path.join(workDir, "web_inpaint.png") });
    await page.uncheck("#hires");
    await page.fill("#prompt", "a blue square");
    await page.fill("#strength", "0.9");
    await page.fill("#steps", "200");
    await page.fill("#seed", "12");
    await page.selectOption("#seamless", "x");  // a seamless image across its left and right edges
    await page.click("#generate");
    await waitForProgress(page);
    await page.waitForFunction(() => document.getElementById("gallery").querySelectorAll("figure").length === 2, null, long);
    const inpainted = await page.getAttribute("#results img", "alt");
    check(inpainted.includes("Mask: yes") && inpainted.includes("Denoising strength: 0.9") &&
          inpainted.includes("Tiling: x") && inpainted.startsWith("a blue square"),
          "the inpaint job's parameters are wrong: " + inpainted);

    stage = "the queue";
    // Two long jobs: the second waits in the queue and is cancelled there.
    await page.click("#tab-txt2img");
    await page.selectOption("#seamless", "");
    await page.fill("#prompt", "a long job");
    await page.fill("#steps", "4000");
    await page.click("#generate");
    await page.waitForSelector("#queue li.running", long);
    await page.fill("#prompt", "a queued job");
    await page.click("#generate");
    await page.waitForSelector("#queue li.queued", long);
    await page.screenshot({ path: path.join(workDir, "web_queue.png") });
    await page.click("#queue li.queued button.cancel");
    await page.waitForFunction(() => [...document.querySelectorAll("#queue li.cancelled .what")]
                                        .some((w) => w.textContent === "a queued job"), null, long);
    check((await page.locator("#queue li.running").count()) === 1, "cancelling the queued job stopped the running one");
    await page.click("#queue li.running button.cancel");
    await page.waitForFunction(() => document.querySelectorAll("#queue li.cancelled").length === 2, null, long);
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("cancelled"), null, long);

    stage = "the gallery after a reload";
    // A reload: the gallery comes from the server's outputs folder.
    reloading = true;
    await page.reload();
    reloading = false;
    await page.waitForFunction(() => document.querySelectorAll("#gallery figure img[src^='blob:']").length === 2, null, long);
    check((await page.textContent("#gallery-note")).startsWith("2 images"), "the gallery note does not count 2 images");
    check(fs.readdirSync(outputDir).filter((f) => f.endsWith(".png")).length === 2, "the outputs folder does not hold 2 PNGs");
    await page.click("#gallery figure >> nth=0");
    await page.waitForSelector("#image-dialog[open]", long);
    await page.screenshot({ path: path.join(workDir, "web_gallery.png") });
    await page.click("#use-settings");
    check((await page.inputValue("#prompt")) === "a blue square" && (await page.inputValue("#seed")) === "12" &&
          (await page.inputValue("#steps")) === "200" && (await page.inputValue("#seamless")) === "x",
          "'use these settings' did not fill the form from the newest image");
    check(failures.length === 0, "page errors: " + failures.join("; "));
  } catch (e) {
    if (openPage) await openPage.screenshot({ path: path.join(workDir, "failure.png") }).catch(() => {});
    throw e;
  } finally {
    await browser.close();
  }
  const exited = new Promise((resolve) => server.on("exit", (code) => resolve(code)));
  server.kill("SIGTERM");
  const code = await exited;
  runningServer = null;
  check(code === 0, "kiln serve exited with " + code + " on SIGTERM");
  console.log("web page test passed; screenshots in " + workDir);
}

main().catch((e) => {
  console.error("web page test failed (" + stage + "): " + e.message);
  if (runningServer) runningServer.kill("SIGKILL");
  process.exit(1);
});
