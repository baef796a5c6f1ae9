// omnistage playground: one page for every model. It reads the model card from /v1/models and shows a tab
// per route the model supports (chat, images, speech, video). Plain browser JavaScript: no build step, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
// A server started with an API key: open the page as /?api_key=... to send it.
const apiKey = new URLSearchParams(location.search).get("api_key");
const auth = apiKey ? {"Authorization": `Bearer ${apiKey}`} : {};
const SIZES = ["64x64", "128x128", "256x256", "512x512", "768x768", "1024x1024"];
const VIDEO_SIZES = ["48x32", "64x64", "320x192", "480x272", "832x480", "1280x720"];
let card = null;  // this server's entry in /v1/models

// ------------------------------------------------------------------ status, errors, metrics

function setStatus(text) { $("status").textContent = text; }

function showError(message) {
  $("error").textContent = message || "";
  $("error").style.display = message ? "block" : "none";
}

// An OpenAI-shaped error {"message", "param", "code", ...} as one readable line, worded as the server put it.
function describe(err) {
  let msg = err.message || err.detail || JSON.stringify(err);
  if (typeof msg !== "string") msg = JSON.stringify(msg);
  return err.param ? `${msg} (field: ${err.param})` : msg;
}

async function apiError(resp) {
  let text = await resp.text();
  try {
    const body = JSON.parse(text);
    text = describe(body.error || body);
  } catch (e) { /* not JSON: keep the raw text */ }
  return `Error ${resp.status}: ${text || resp.statusText}`;
}

const seconds = (ms) => `${(ms / 1000).toFixed(2)} s`;

// Token counts only mean something for a model with an llm stage.
const countsTokens = () => (card && card.stages || []).some((s) => s.kind === "llm");

// The last request's numbers go as soon as another starts, so an error never shows stale ones.
function clearMetrics() {
  $("metrics").classList.add("hidden");
  $("metrics-rows").replaceChildren();
  $("metrics-summary").textContent = "";
}

// stage_metrics: {"<stage id>": {queue_time_s, run_time_s, num_steps, num_tokens, peak_memory_mb}}
function showMetrics(stageMetrics, summary) {
  const rows = Object.entries(stageMetrics || {}).sort((a, b) => Number(a[0]) - Number(b[0])).map(([sid, m]) => {
    const stage = (card && card.stages || []).find((s) => String(s.stage_id) === sid) || {};
    const cells = [`${sid} ${stage.name || ""}`, stage.kind || "", fmt(m.queue_time_s, 3), fmt(m.run_time_s, 3),
                   m.num_steps || "", ...(countsTokens() ? [m.num_tokens || ""] : []), fmt(m.peak_memory_mb, 0)];
    const tr = document.createElement("tr");
    for (const c of cells) tr.appendChild(Object.assign(document.createElement("td"), {textContent: c}));
    return tr;
  });
  $("metrics-rows").replaceChildren(...rows);
  $("metrics-summary").textContent = summary;
  $("metrics").classList.remove("hidden");
}

function fmt(value, digits) { return typeof value === "number" ? value.toFixed(digits) : ""; }

// ------------------------------------------------------------------ HTTP

async function call(path, init = {}) {
  const resp = await fetch(path, {...init, headers: {...auth, ...(init.headers || {})}});
  if (!resp.ok) throw new Error(await apiError(resp));
  return resp;
}

const postJSON = (path, body) => call(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                             body: JSON.stringify(body)});

// Server-sent events: each `data:` payload parsed as JSON, until [DONE]. An error event throws its message.
async function* sseEvents(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const payload = JSON.parse(data);
      if (payload.error) throw new Error(`Error: ${describe(payload.error)}`);
      yield payload;
    }
  }
}

// ------------------------------------------------------------------ form helpers

function numberOrNull(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}

// The "More parameters (JSON)" box of a form: an object, or an error naming the box.
function extraParams(id) {
  const text = $(id).value.trim();
  if (!text) return {};
  let value;
  try { value = JSON.parse(text); } catch (e) { throw new Error(`More parameters: not valid JSON (${e.message})`); }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("More parameters: must be a JSON object like {\"seed\": 1}");
  }
  return value;
}

// Only the fields that were filled in.
function compact(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== null && v !== undefined && v !== ""));
}

// Options `values` (plus `chosen` if missing), `chosen` selected; with `blank`, a first option "" labelled so
// (selected when nothing is chosen: the field is then left out of the request).
function fillSelect(select, values, chosen, blank = null) {
  const option = (value, label) => Object.assign(document.createElement("option"), {value, textContent: label});
  const list = chosen && !values.includes(chosen) ? [chosen, ...values] : values;
  select.replaceChildren(...(blank ? [option("", blank)] : []), ...list.map((v) => option(v, v)));
  select.value = chosen || "";
}

const readAsDataURL = (file) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = () => reject(new Error(`could not read ${file.name}`));
  reader.readAsDataURL(file);
});

function base64Bytes(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

// Disable a form's button and report errors while `work` runs.
async function running(button, label, work) {
  showError("");
  clearMetrics();
  button.disabled = true;
  setStatus(label);
  try {
    await work();
  } catch (e) {
    showError(e.message);
    setStatus("");
  } finally {
    button.disabled = false;
  }
}

// ------------------------------------------------------------------ streamed audio

// 16-bit PCM chunks: played through Web Audio as they arrive (gap-free, each scheduled after the last),
// and kept, so the whole clip can become a WAV for an <audio> player once the stream ends.
class PcmPlayer {
  constructor() {
    this.chunks = [];
    this.rate = null;
    this.next = 0;
    this.playing = new Set();  // sources scheduled and not yet over (stop() silences them: a barge-in)
    this.played = 0;           // samples played to the end
    try { this.ctx = new AudioContext(); } catch (e) { this.ctx = null; }  // made inside a click: allowed to play
    if (PcmPlayer.current && PcmPlayer.current.ctx) PcmPlayer.current.ctx.close();  // one live context at a time
    PcmPlayer.current = this;
  }

  push(bytes, rate) {
    this.rate = rate || this.rate;
    this.chunks.push(bytes);
    if (!this.ctx || !this.rate) return;
    const samples = new Int16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >> 1);
    const buffer = this.ctx.createBuffer(1, samples.length, this.rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    source.onended = () => { if (this.playing.delete(source)) this.played += samples.length; };
    this.playing.add(source);
    this.next = Math.max(this.next, this.ctx.currentTime + 0.05);
    source.start(this.next);
    this.next += buffer.duration;
  }

  // Silence what is still scheduled (what has played stays counted in `played`).
  stop() {
    const sources = [...this.playing];
    this.playing.clear();
    for (const s of sources) s.stop();
  }

  get sampleCount() { return this.chunks.reduce((n, c) => n + (c.byteLength >> 1), 0); }

  wav() {
    const dataBytes = this.sampleCount * 2;
    const header = new DataView(new ArrayBuffer(44));
    const text = (offset, s) => [...s].forEach((ch, i) => header.setUint8(offset + i, ch.charCodeAt(0)));
    text(0, "RIFF"); header.setUint32(4, 36 + dataBytes, true); text(8, "WAVE");
    text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, this.rate, true); header.setUint32(28, this.rate * 2, true);
    header.setUint16(32, 2, true); header.setUint16(34, 16, true);
    text(36, "data"); header.setUint32(40, dataBytes, true);
    return new Blob([header, ...this.chunks], {type: "audio/wav"});
  }
}

// ------------------------------------------------------------------ model card -> tabs

const TABS = {chat: "tab-chat", "images.generations": "tab-image", "audio.speech": "tab-speech", videos: "tab-video"};

function showTab(tabId) {
  for (const tab of document.querySelectorAll(".tab")) {
    const on = tab.id === tabId;
    tab.classList.toggle("active", on);
    tab.setAttribute("aria-selected", String(on));
    $(tab.dataset.panel).classList.toggle("hidden", !on);
  }
}

async function loadModel() {
  try {
    const entry = ((await (await call("/v1/models")).json()).data || [])[0];
    if (!entry) throw new Error("the server lists no model");
    card = entry;
  } catch (e) {
    $("model-name").textContent = "unknown";
    showError(`Could not read /v1/models: ${e.message}` +
              (e.message.startsWith("Error 401") ? "\nOpen the page as /?api_key=YOUR_KEY" : ""));
    return;
  }
  const outputs = card.output_modalities || [];
  document.title = `${card.id} · omnistage playground`;
  $("model-name").textContent = `${card.id} (outputs: ${outputs.join(", ")})`;
  const stages = (card.stages || []).map((s) => `${s.kind}→${s.output}`).join(" · ");
  $("model-detail").textContent = `— pipeline ${card.pipeline}: ${stages}`;
  const routes = card.routes || [];
  const shown = Object.entries(TABS).filter(([route]) => routes.includes(route)).map(([, tab]) => tab);
  // a chat model that speaks can hold a spoken conversation (/v1/realtime: playground-talk.js)
  if (routes.includes("chat") && outputs.includes("audio")) shown.push("tab-talk");
  for (const tab of shown) $(tab).classList.remove("hidden");
  $("mode-edit").parentElement.classList.toggle("hidden", !routes.includes("images.edits"));
  // Open on what the model is for: video, speech, images, else chat.
  const first = ["tab-video", "tab-speech", "tab-image", "tab-chat"].find((t) => shown.includes(t));
  if (first) showTab(first);
  else showError("This model supports none of the routes the playground knows.");
  setupDefaults(card.defaults || {});
  setupVocabulary();
  if (!countsTokens()) $("metrics-tokens").remove();
  // a model that answers chat with pictures, not text: the chat box starts with something it can draw
  if (!outputs.includes("text")) {
    $("chat-input").value = (card.example_prompts || [])[0] || "";
    $("chat-input").placeholder = "Describe the picture (paste or attach an image to start from)";
  }
}

// The model's own words (the demo knows only its training captions'): clickable example prompts and the list.
function setupVocabulary() {
  const examples = card.example_prompts || [];
  $("example-prompts").replaceChildren(...examples.map((text) => {
    const button = Object.assign(document.createElement("button"), {type: "button", textContent: text,
                                                                    className: "example"});
    button.addEventListener("click", () => { $("prompt").value = text; $("prompt").focus(); });
    return button;
  }));
  $("examples").classList.toggle("hidden", !examples.length);
  if (examples.length) $("prompt").value = examples[0];
  const vocabulary = card.vocabulary || {};
  const kinds = Object.entries(vocabulary).map(([kind, words]) => `${kind}: ${words.join(", ")}`);
  $("vocabulary").textContent = kinds.length ? `This model knows only these words — ${kinds.join("; ")}.` : "";
  $("vocabulary").classList.toggle("hidden", !kinds.length);
}

function setupDefaults(defaults) {
  // the sizes this model draws (its card: native size up to its limit), its native size chosen
  const sizes = card.image_sizes;
  if (sizes && sizes.choices && sizes.choices.length) fillSelect($("size"), sizes.choices, sizes.native);
  else fillSelect($("size"), SIZES, defaults.size, defaults.size ? null : "model default");
  fillSelect($("video-size"), VIDEO_SIZES, defaults.size, defaults.size ? null : "model default");
  if (defaults.num_inference_steps) {
    $("steps").value = defaults.num_inference_steps;
    $("video-steps").placeholder = `default (${defaults.num_inference_steps})`;
  }
  if (defaults.guidance_scale !== undefined) {
    $("guidance").placeholder = $("video-guidance").placeholder = `default (${defaults.guidance_scale})`;
  }
  if (defaults.num_frames) $("video-frames").placeholder = `default (${defaults.num_frames})`;
  if (defaults.max_tokens) $("chat-max-tokens").placeholder = `default (${defaults.max_tokens})`;
  if (defaults.temperature !== undefined) $("chat-temperature").placeholder = `default (${defaults.temperature})`;
  const voices = card.voices || [];
  fillSelect($("voice"), voices, card.default_voice || voices[0]);
  $("voice").disabled = !voices.length;
  // A model with several outputs: let the user pick what the chat answer holds.
  const outputs = card.output_modalities || [];
  if (outputs.length > 1) {
    $("chat-modalities").replaceChildren(...outputs.map((m) => {
      const label = document.createElement("label");
      const box = Object.assign(document.createElement("input"), {type: "checkbox", value: m, checked: true});
      label.append(box, ` ${m}`);
      return label;
    }));
    $("chat-modalities-box").classList.remove("hidden");
  }
}

// ------------------------------------------------------------------ chat

const conversation = [];  // the messages sent with each request
let attachments = [];     // content parts waiting for the next message: {part, name, preview}

async function attach(files) {
  for (const file of files) {
    const url = await readAsDataURL(file);
    if (file.type.startsWith("image/")) {
      attachments.push({part: {type: "image_url", image_url: {url}}, name: file.name, preview: url});
    } else if (file.type.startsWith("audio/")) {
      const format = {"audio/mpeg": "mp3", "audio/x-wav": "wav", "audio/wave": "wav"}[file.type] || file.type.split("/")[1];
      attachments.push({part: {type: "input_audio", input_audio: {data: url, format}}, name: file.name});
    } else {
      throw new Error(`${file.name}: only images and audio can be attached`);
    }
  }
  renderAttachments();
}

function renderAttachments() {
  $("chat-attachments").replaceChildren(...attachments.map((a, i) => {
    const chip = Object.assign(document.createElement("span"), {className: "chip"});
    if (a.preview) chip.appendChild(Object.assign(document.createElement("img"), {src: a.preview, alt: ""}));
    chip.append(a.name);
    const remove = Object.assign(document.createElement("button"), {type: "button", textContent: "×", title: "remove"});
    remove.addEventListener("click", () => { attachments.splice(i, 1); renderAttachments(); });
    chip.appendChild(remove);
    return chip;
  }));
}

function bubble(role, text) {
  const div = Object.assign(document.createElement("div"), {className: `msg ${role}`});
  div.appendChild(Object.assign(document.createElement("span"), {className: "who", textContent: role}));
  const body = Object.assign(document.createElement("span"), {className: "text", textContent: text || ""});
  div.appendChild(body);
  $("chat-log").appendChild(div);
  return div;
}

function addMedia(parent, part) {
  if (part.type === "image_url") {
    parent.appendChild(Object.assign(document.createElement("img"), {src: part.image_url.url, alt: "generated image"}));
  } else if (part.type === "video_url") {
    parent.appendChild(Object.assign(document.createElement("video"),
                                     {src: part.video_url.url, controls: true, loop: true, muted: true, autoplay: true}));
  } else if (part.type === "text") {
    parent.querySelector(".text").textContent += part.text;
  }
}

async function sendChat() {
  const text = $("chat-input").value.trim();
  if (!text && !attachments.length) throw new Error("Type a message first.");
  const parts = attachments.map((a) => a.part);
  const content = parts.length ? [...(text ? [{type: "text", text}] : []), ...parts] : text;
  const userDiv = bubble("user", text);
  for (const a of attachments) if (a.preview) addMedia(userDiv, a.part);
  const body = {
    model: card.id, messages: [...conversation, {role: "user", content}], stream: true,
    stream_options: {include_usage: true}, return_stage_metrics: true,
    ...compact({max_tokens: numberOrNull("chat-max-tokens"), temperature: numberOrNull("chat-temperature")}),
    ...extraParams("chat-extra"),
  };
  const picked = [...document.querySelectorAll("#chat-modalities input:checked")].map((b) => b.value);
  if (picked.length && picked.length < (card.output_modalities || []).length) body.modalities = picked;

  const answer = bubble("assistant", "");
  answer.dataset.deltas = "0";
  answer.dataset.done = "false";
  const t0 = performance.now();
  let first = null, usage = null, metrics = null, reply = "";
  // made now, while the click still counts as a user gesture, so streamed audio may play
  let player = (card.output_modalities || []).includes("audio") ? new PcmPlayer() : null;
  let resp;
  try {
    resp = await postJSON("/v1/chat/completions", body);
  } catch (e) {  // refused: the message was not sent, so it leaves the log (and stays in the input box)
    userDiv.remove();
    answer.remove();
    throw e;
  }
  conversation.push({role: "user", content});
  attachments = [];
  renderAttachments();
  $("chat-input").value = "";
  for await (const chunk of sseEvents(resp)) {
    if (chunk.usage && !(chunk.choices || []).length) usage = chunk.usage;
    if (chunk.stage_metrics) metrics = chunk.stage_metrics;
    const delta = ((chunk.choices || [])[0] || {}).delta || {};
    if (typeof delta.content === "string" && delta.content) {
      reply += delta.content;
      answer.querySelector(".text").textContent = reply;
      answer.dataset.deltas = String(Number(answer.dataset.deltas) + 1);
    } else if (Array.isArray(delta.content)) {
      for (const part of delta.content) addMedia(answer, part);
    }
    if (delta.audio && delta.audio.data) {
      player = player || new PcmPlayer();
      player.push(base64Bytes(delta.audio.data), delta.audio.sample_rate);
    }
    if (first === null && (delta.content || delta.audio)) first = performance.now() - t0;
    $("chat-log").scrollTop = $("chat-log").scrollHeight;
  }
  if (player && player.sampleCount) {
    answer.appendChild(Object.assign(document.createElement("audio"), {controls: true, src: URL.createObjectURL(player.wav())}));
  }
  if (reply) conversation.push({role: "assistant", content: reply});
  answer.dataset.done = "true";
  const total = performance.now() - t0;
  const tokens = usage && countsTokens()
    ? ` · tokens: ${usage.prompt_tokens} prompt, ${usage.completion_tokens} completion` : "";
  showMetrics(metrics, `total ${seconds(total)}` + (first !== null ? ` · first output ${seconds(first)}` : "") + tokens);
  setStatus(`answered in ${seconds(total)}`);
}

// ------------------------------------------------------------------ images

let editImage = null;  // the File to edit (uploaded or pasted)

function imageMode() { return $("mode-edit").checked ? "edit" : "generate"; }

function syncImageMode() {
  $("edit-box").classList.toggle("hidden", imageMode() !== "edit");
  $("generate").textContent = imageMode() === "edit" ? "Edit" : "Generate";
}

async function setEditImage(file) {
  editImage = file;
  $("edit-preview").src = await readAsDataURL(file);
  $("edit-preview").classList.remove("hidden");
  $("mode-edit").checked = true;
  syncImageMode();
}

async function generateImages() {
  const prompt = $("prompt").value.trim();
  if (!prompt) throw new Error("Type a prompt first.");
  $("warnings").classList.add("hidden");
  const fields = compact({
    model: card.id, prompt, n: 1, size: $("size").value, response_format: "b64_json",
    num_inference_steps: numberOrNull("steps"), seed: numberOrNull("seed"), guidance_scale: numberOrNull("guidance"),
    return_stage_metrics: true, ...extraParams("image-extra"),
  });
  const t0 = performance.now();
  let resp;
  if (imageMode() === "edit") {
    if (!editImage) throw new Error("Choose or paste an image to edit first.");
    const form = new FormData();
    form.append("image", editImage, editImage.name || "image.png");
    for (const [k, v] of Object.entries({...fields, strength: numberOrNull("strength")})) {
      if (v !== null) form.append(k, typeof v === "object" ? JSON.stringify(v) : String(v));
    }
    resp = await call("/v1/images/edits", {method: "POST", body: form});
  } else {
    resp = await postJSON("/v1/images/generations", fields);
  }
  const out = await resp.json();
  // the server's words about the prompt (e.g. ones the demo was not trained on): shown beside the picture
  $("warnings").textContent = (out.warnings || []).join("\n");
  $("warnings").classList.toggle("hidden", !(out.warnings || []).length);
  $("images").replaceChildren(...(out.data || []).map((d, i) => {
    const img = document.createElement("img");
    img.id = i === 0 ? "result-image" : `result-image-${i}`;
    img.alt = prompt;
    img.src = `data:image/${out.output_format || "png"};base64,${d.b64_json}`;
    return img;
  }));
  const total = performance.now() - t0;
  showMetrics(out.stage_metrics, `total ${seconds(total)} · ${(out.data || []).length} image(s) ${out.size || ""}`);
  setStatus(`done in ${seconds(total)}`);
}

// ------------------------------------------------------------------ speech

async function speak() {
  const input = $("speech-input").value.trim();
  if (!input) throw new Error("Type some text first.");
  const stream = $("speech-stream").checked;
  const body = compact({model: card.id, input, voice: $("voice").value || null, return_stage_metrics: true,
                        ...extraParams("speech-extra")});
  const audio = $("speech-audio");
  audio.classList.add("hidden");
  audio.removeAttribute("src");
  const t0 = performance.now();
  let first = null, metrics = null, blob, rate;
  if (stream) {
    const player = new PcmPlayer();  // created in the click handler: the browser lets it play
    const resp = await postJSON("/v1/audio/speech", {...body, stream: true, stream_format: "sse", response_format: "pcm"});
    for await (const event of sseEvents(resp)) {
      if (event.type === "speech.audio.delta") {
        if (first === null) first = performance.now() - t0;
        player.push(base64Bytes(event.audio), event.sample_rate || card.sample_rate);
        $("speech-info").textContent = `receiving… ${(player.sampleCount / player.rate).toFixed(2)} s of audio`;
      } else if (event.type === "speech.audio.done") {
        metrics = event.stage_metrics;
      }
    }
    if (!player.sampleCount) throw new Error("the server sent no audio");
    blob = player.wav();
    rate = player.rate;
  } else {
    const resp = await postJSON("/v1/audio/speech", {...body, response_format: "wav"});
    const header = resp.headers.get("X-Stage-Metrics");
    metrics = header ? JSON.parse(header) : null;
    rate = Number(resp.headers.get("X-Sample-Rate"));
    blob = await resp.blob();
  }
  audio.src = URL.createObjectURL(blob);
  audio.classList.remove("hidden");
  if (!stream) audio.play().catch(() => {});  // streamed audio already played through Web Audio
  const total = performance.now() - t0;
  $("speech-info").textContent = `${rate} Hz` + (first !== null ? ` · first audio after ${seconds(first)}` : "");
  showMetrics(metrics, `total ${seconds(total)}` + (first !== null ? ` · first audio ${seconds(first)}` : ""));
  setStatus(`spoke in ${seconds(total)}`);
}

// ------------------------------------------------------------------ video

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function makeVideo() {
  const prompt = $("video-prompt").value.trim();
  if (!prompt) throw new Error("Type a prompt first.");
  const extra = extraParams("video-extra");
  const fields = compact({
    model: card.id, prompt, size: $("video-size").value, num_frames: numberOrNull("video-frames"),
    num_inference_steps: numberOrNull("video-steps"), seed: numberOrNull("video-seed"),
    guidance_scale: numberOrNull("video-guidance"), return_stage_metrics: true,
    extra_params: Object.keys(extra).length ? JSON.stringify(extra) : null,
  });
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
  const reference = $("video-reference").files[0];
  if (reference) form.append("input_reference", reference, reference.name);
  const video = $("result-video");
  video.classList.add("hidden");
  video.removeAttribute("src");
  const t0 = performance.now();
  let job = await (await call("/v1/videos", {method: "POST", body: form})).json();
  $("video-job").classList.remove("hidden");
  const progress = $("video-progress");
  progress.value = 0;
  while (job.status !== "completed") {
    if (job.status === "failed") throw new Error(`Error: video job failed: ${describe(job.error || {})}`);
    $("video-status").textContent = `${job.status} ${job.progress}%`;
    progress.value = job.progress;
    await sleep(200);
    job = await (await call(`/v1/videos/${job.id}`)).json();
  }
  progress.value = 100;
  $("video-status").textContent = `completed 100% in ${job.inference_time_s} s`;
  const mp4 = await (await call(`/v1/videos/${job.id}/content`)).blob();
  video.src = URL.createObjectURL(mp4);
  video.classList.remove("hidden");
  video.play().catch(() => {});
  const total = performance.now() - t0;
  showMetrics(job.stage_metrics, `total ${seconds(total)} · job ${job.id}`);
  setStatus(`video ready in ${seconds(total)}`);
}

// ------------------------------------------------------------------ wiring

for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.id));

function onSubmit(formId, buttonId, label, work) {
  $(formId).addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!card) { showError("The model card did not load; reload the page."); return; }
    running($(buttonId), label, work);
  });
}

onSubmit("chat-form", "chat-send", "thinking…", sendChat);
onSubmit("form", "generate", "generating…", generateImages);
onSubmit("speech-form", "speech-go", "speaking…", speak);
onSubmit("video-form", "video-go", "queued…", makeVideo);

$("chat-input").addEventListener("keydown", (ev) => {  // Enter sends, Shift+Enter is a new line
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("chat-form").requestSubmit(); }
});
$("chat-attach").addEventListener("change", (ev) => {
  attach([...ev.target.files]).catch((e) => showError(e.message));
  ev.target.value = "";
});
$("chat-clear").addEventListener("click", () => {
  conversation.length = 0;
  $("chat-log").replaceChildren();
});
for (const radio of document.querySelectorAll("input[name=image-mode]")) radio.addEventListener("change", syncImageMode);
$("edit-file").addEventListener("change", (ev) => {
  if (ev.target.files[0]) setEditImage(ev.target.files[0]).catch((e) => showError(e.message));
});
// Paste an image anywhere: it becomes the image to edit (image tab) or an attachment (chat tab).
document.addEventListener("paste", (ev) => {
  const files = [...((ev.clipboardData && ev.clipboardData.files) || [])].filter((f) => f.type.startsWith("image/"));
  if (!files.length) return;
  ev.preventDefault();
  const done = $("tab-chat").classList.contains("active") ? attach(files) : setEditImage(files[0]);
  done.catch((e) => showError(e.message));
});

loadModel();
