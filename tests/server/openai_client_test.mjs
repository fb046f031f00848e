// The HTTP API through the real `openai` npm client (tests/tools/package.json) and curl, against
// flux2_server on the embedded tiny checkpoint (CPU): generation with n=2 (PNGs of the right size,
// consecutive seeds, the same bytes for the same seed), editing with two files equal to the
// golden's image_u8 within tests/data/README.md's float32 bar (the multi-reference case of
// tests/data/tiny-klein/edit_cases.json), server-sent events (one progress event per step, then the
// image), a bad size refused naming `size` (SDK and curl), 429 + Retry-After under overload (curl),
// /v1/models, and LoRA adapters (tests/data/tiny-klein/lora_cases.json's first generation).
// Run: node tests/server/openai_client_test.mjs --server build/bin/flux2_server
//        --tools-dir tests/tools --data-dir tests/data      (ctest: server_openai_client)
import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import zlib from "node:zlib";
import assert from "node:assert/strict";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, arg, i, all) => {
    if (arg.startsWith("--")) pairs.push([arg.slice(2), all[i + 1]]);
    return pairs;
  }, []),
);
const require = createRequire(path.resolve(args["tools-dir"], "package.json"));
const { default: OpenAI, toFile, BadRequestError } = require("openai");

// ---- PNG and safetensors, enough for the checks below
function pngChunks(data) {
  const chunks = [];
  for (let at = 8; at < data.length; ) {
    const length = data.readUInt32BE(at);
    chunks.push([data.toString("latin1", at + 4, at + 8), data.subarray(at + 8, at + 8 + length)]);
    at += 12 + length;
  }
  return chunks;
}

function pngSize(data) {
  assert.equal(data.toString("latin1", 1, 4), "PNG");
  return [data.readUInt32BE(16), data.readUInt32BE(20)];
}

// 8-bit RGB PNG -> H x W x 3 bytes (every filter type).
function decodePng(data) {
  const [width, height] = pngSize(data);
  const idat = Buffer.concat(pngChunks(data).filter(([kind]) => kind === "IDAT").map(([, p]) => p));
  const raw = zlib.inflateSync(idat);
  const stride = width * 3;
  const out = Buffer.alloc(height * stride);
  for (let y = 0; y < height; ++y) {
    const filter = raw[y * (stride + 1)];
    for (let x = 0; x < stride; ++x) {
      const v = raw[y * (stride + 1) + 1 + x];
      const a = x >= 3 ? out[y * stride + x - 3] : 0;
      const b = y > 0 ? out[(y - 1) * stride + x] : 0;
      const c = x >= 3 && y > 0 ? out[(y - 1) * stride + x - 3] : 0;
      let predictor = 0;
      if (filter === 1) predictor = a;
      else if (filter === 2) predictor = b;
      else if (filter === 3) predictor = (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        predictor = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      out[y * stride + x] = (v + predictor) & 0xff;
    }
  }
  return { width, height, pixels: out };
}

function readSafetensor(file, name) {
  const data = readFileSync(file);
  const headerLength = Number(data.readBigUInt64LE(0));
  const header = JSON.parse(data.toString("utf8", 8, 8 + headerLength));
  const [begin, end] = header[name].data_offsets;
  return { shape: header[name].shape, bytes: data.subarray(8 + headerLength + begin, 8 + headerLength + end) };
}

// Fails unless `png` is the golden u8 image `name` ([1, 3, H, W]) of `file`: tests/data/README.md's
// float32 bar, equal except at most 1 level on at most 0.5% of values.
function expectGoldenU8(png, file, name) {
  const { width, height, pixels } = decodePng(png);
  const want = readSafetensor(file, name);
  assert.deepEqual([width, height], [want.shape[3], want.shape[2]]);
  let offByOne = 0, worse = 0;
  for (let c = 0; c < 3; ++c)
    for (let i = 0; i < width * height; ++i) {
      const d = Math.abs(pixels[i * 3 + c] - want.bytes[c * width * height + i]);
      offByOne += d === 1;
      worse += d > 1;
    }
  assert.equal(worse, 0);
  assert.ok(offByOne <= 0.005 * 3 * width * height, `${offByOne} values one level off`);
}

// ---- the server
async function startServer(extra) {
  const server = spawn(args.server, ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                                     "--http-port", "0", "--backend", "cpu", ...extra],
                       { stdio: ["ignore", "pipe", "inherit"] });
  const lines = readline.createInterface({ input: server.stdout });
  for await (const line of lines) {
    const match = /listening grpc=(\d+) metrics=(\d+) http=(\d+)/.exec(line);
    if (match) {
      server.metrics = Number(match[2]);
      server.http = Number(match[3]);
      break;
    }
  }
  assert.ok(server.http, "flux2_server did not print its ports");
  for (let i = 0; i < 600; ++i) {
    const ready = await fetch(`http://127.0.0.1:${server.http}/ready`).catch(() => null);
    if (ready?.status === 200) return server;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error("flux2_server never became ready");
}

function stop(server) {
  server.kill("SIGTERM");
  return new Promise((resolve) => server.on("exit", resolve));
}

function curl(...curlArgs) {
  return execFileSync("curl", ["-s", "-i", ...curlArgs], { encoding: "latin1" });
}

const tests = [];
const test = (name, body) => tests.push([name, body]);

// The editing golden with two references is of klein base: the tiny checkpoint's components
// behind a model_index.json marked is_distilled false (the Python client test does the same).
const checkpoint = path.resolve(args["data-dir"], "tiny-klein", "checkpoint");
const tmp = mkdtempSync(path.join(os.tmpdir(), "flux2-openai-"));
const base_checkpoint = path.join(tmp, "tiny-klein-base");
mkdirSync(base_checkpoint);
for (const name of readdirSync(checkpoint)) {
  if (name !== "model_index.json") symlinkSync(path.join(checkpoint, name), path.join(base_checkpoint, name));
}
const index = JSON.parse(readFileSync(path.join(checkpoint, "model_index.json"), "utf8"));
writeFileSync(path.join(base_checkpoint, "model_index.json"), JSON.stringify({ ...index, is_distilled: false }));

// --max-sequence-length 64: the goldens' text length.
const server = await startServer(["--model-dir", base_checkpoint, "--max-sequence-length", "64"]);
const base = `http://127.0.0.1:${server.http}`;
const client = new OpenAI({ apiKey: "unused", baseURL: `${base}/v1`, maxRetries: 0 });

test("models lists the served checkpoint", async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["tiny-klein-base"]);
});

test("generate n=2: PNGs of the size asked, consecutive seeds, same seed same bytes", async () => {
  const request = { model: "tiny-klein-base", prompt: "a red fox in the snow", n: 2, size: "128x96",
                    num_inference_steps: 2, seed: 1234 };
  const response = await client.images.generate(request);
  assert.equal(response.data.length, 2);
  const pngs = response.data.map((image) => Buffer.from(image.b64_json, "base64"));
  for (const png of pngs) assert.deepEqual(pngSize(png), [128, 96]);
  assert.deepEqual(response.data.map((image) => image.seed), [1234, 1235]);
  assert.notDeepEqual(pngs[0], pngs[1]);
  const again = await client.images.generate({ ...request, n: 1 });
  assert.deepEqual(Buffer.from(again.data[0].b64_json, "base64"), pngs[0]);
});

test("edit with two files equals the golden image_u8 (float32 bar)", async () => {
  const data = path.resolve(args["data-dir"], "tiny-klein");
  const cases = JSON.parse(readFileSync(path.join(data, "edit_cases.json"), "utf8"));
  const golden = cases[1];
  assert.equal(golden.references.length, 2);
  const images = await Promise.all(golden.references.map((file) =>
    toFile(readFileSync(path.join(data, file)), path.basename(file), { type: "image/png" })));
  const response = await client.images.edit({
    image: images, prompt: golden.prompt, size: `${golden.width}x${golden.height}`,
    num_inference_steps: golden.steps, seed: golden.seed, guidance_scale: golden.guidance_scale,
  });
  expectGoldenU8(Buffer.from(response.data[0].b64_json, "base64"),
                 path.join(data, "edit.safetensors"), "case1.image_u8");
});

test("stream: one progress event per step, then the image", async () => {
  const stream = await client.images.generate({ prompt: "a fox", size: "64x64", stream: true,
                                                num_inference_steps: 3, seed: 5 });
  const types = [];
  let image = null;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "image_generation.completed") image = event;
  }
  assert.deepEqual(types, ["image_generation.progress", "image_generation.progress",
                           "image_generation.progress", "image_generation.completed"]);
  assert.deepEqual(pngSize(Buffer.from(image.b64_json, "base64")), [64, 64]);
});

test("a bad size is refused naming `size` (SDK and curl)", async () => {
  await assert.rejects(client.images.generate({ prompt: "a fox", size: "100x100" }), (error) => {
    assert.ok(error instanceof BadRequestError);
    assert.equal(error.status, 400);
    assert.equal(error.param, "size");
    return true;
  });
  const reply = curl("-H", "Content-Type: application/json",
                     "-d", '{"prompt": "a fox", "size": "100x100"}', `${base}/v1/images/generations`);
  assert.match(reply, /^HTTP\/1\.1 400/);
  const body = JSON.parse(reply.slice(reply.indexOf("\r\n\r\n") + 4));
  assert.equal(body.error.param, "size");
  assert.equal(body.error.type, "invalid_request_error");
  assert.match(body.error.message, /^size: 100 is not a positive multiple of 16/);
});

const failures = [];
for (const [name, body] of tests) {
  try {
    await body();
    console.log(`ok   ${name}`);
  } catch (error) {
    failures.push(name);
    console.log(`FAIL ${name}\n${error.stack}`);
  }
}
await stop(server);

// Overload: one request running (slow steps), one queued, the next refused at once.
let slow = null;
try {
  slow = await startServer(["--queue-depth", "1", "--test-step-delay-ms", "400",
                            "--max-sequence-length", "64"]);
  const url = `http://127.0.0.1:${slow.http}/v1/images/generations`;
  // 24 steps x 400 ms: the first request runs ~10 s, time enough to see the second one queued on a
  // loaded CI machine (the poll below waits up to 60 s, the bound of the other waits).
  const body = JSON.stringify({ prompt: "a fox", size: "64x64", num_inference_steps: 24 });
  const post = () => fetch(url, { method: "POST", body, headers: { "Content-Type": "application/json" } });
  const waitForMetric = async (pattern, what) => {
    for (let i = 0; ; ++i) {
      const metrics = await (await fetch(`http://127.0.0.1:${slow.metrics}/metrics`)).text();
      if (pattern.test(metrics)) return;
      assert.ok(i < 3000, what);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  };
  // One at a time: sent together, the second can reach the queue before the engine has taken the
  // first out of it, and is then (rightly) refused.
  const held = [post()];
  await waitForMetric(/^flux2_requests_in_flight 1$/m, "the first request never started");
  held.push(post());
  await waitForMetric(/^flux2_queue_depth 1$/m, "the second request never queued");
  const reply = curl("-H", "Content-Type: application/json", "-d", body, url);
  assert.match(reply, /^HTTP\/1\.1 429/, reply.slice(0, 200));
  assert.match(reply, /\r\nRetry-After: 1\r\n/i);
  assert.equal(JSON.parse(reply.slice(reply.indexOf("\r\n\r\n") + 4)).error.type, "rate_limit_error");
  const statuses = (await Promise.all(held)).map((r) => r.status);
  assert.deepEqual(statuses, [200, 200]);
  console.log("ok   overload is 429 with Retry-After (curl)");
} catch (error) {
  failures.push("overload");
  console.log(`FAIL overload\n${error.stack}`);
} finally {
  if (slow) await stop(slow);
}

// LoRA adapters through the SDK (the request's `loras` extension): the golden generation with two
// adapters and the editing case equal their image_u8 within the float32 bar, and a missing adapter
// is refused naming it.
let lora = null;
try {
  const data = path.resolve(args["data-dir"], "tiny-klein");
  const loraDir = path.join(tmp, "loras");
  mkdirSync(loraDir);
  const cases = JSON.parse(readFileSync(path.join(data, "lora_cases.json"), "utf8"));
  for (const [name, adapter] of Object.entries(cases.adapters)) {
    writeFileSync(path.join(loraDir, `${name}.safetensors`), readFileSync(path.join(data, adapter.file)));
  }
  lora = await startServer(["--lora-dir", loraDir, "--max-sequence-length", "64"]);
  const loraClient = new OpenAI({ apiKey: "unused", baseURL: `http://127.0.0.1:${lora.http}/v1`,
                                  maxRetries: 0 });
  const golden = cases.pipeline_cases[0];
  const response = await loraClient.images.generate({
    prompt: golden.prompt, size: `${golden.width}x${golden.height}`, seed: golden.seed,
    num_inference_steps: golden.steps,
    loras: golden.adapters.map(([name, scale]) => ({ name, scale })),
  });
  expectGoldenU8(Buffer.from(response.data[0].b64_json, "base64"),
                 path.join(data, "lora_pipeline.safetensors"), "case0.image_u8");
  // The editing case through images.edit: a multipart form, whose `loras` field holds JSON text.
  const edit = cases.pipeline_cases[1];
  const reference = await toFile(readFileSync(path.join(data, edit.references[0])),
                                 path.basename(edit.references[0]), { type: "image/png" });
  const edited = await loraClient.images.edit({
    image: reference, prompt: edit.prompt, num_inference_steps: edit.steps, seed: edit.seed,
    guidance_scale: edit.guidance_scale,
    loras: JSON.stringify(edit.adapters.map(([name, scale]) => ({ name, scale }))),
  });
  assert.equal(edited.loras[0].name, edit.adapters[0][0]);
  expectGoldenU8(Buffer.from(edited.data[0].b64_json, "base64"),
                 path.join(data, "lora_pipeline.safetensors"), "case1.image_u8");
  await assert.rejects(
    loraClient.images.generate({ prompt: "a fox", size: "64x64", loras: [{ name: "missing" }] }),
    (error) => {
      assert.ok(error instanceof BadRequestError);
      assert.equal(error.param, "loras[0].name");
      assert.match(error.message, /no adapter 'missing' under --lora-dir/);
      return true;
    });
  console.log("ok   loras: the golden generation with two adapters, the editing case; a missing one named (SDK)");
} catch (error) {
  failures.push("loras");
  console.log(`FAIL loras\n${error.stack}`);
} finally {
  if (lora) await stop(lora);
}

rmSync(tmp, { recursive: true, force: true });
if (failures.length) {
  console.log(`${failures.length} failed: ${failures.join(", ")}`);
  process.exit(1);
}
console.log("all passed");
