// The playground's talk panel: a spoken conversation over the /v1/realtime WebSocket, in OpenAI's Realtime
// events (GA), the same ones the official client sends. The microphone streams in as 16-bit PCM
// (talk-worklet.js) at the audio context's own rate (the server resamples it once); the answer's speech
// plays through Web Audio as its deltas arrive (PcmPlayer, playground.js). Turns: server VAD ("just talk")
// or push to talk (commit on release). Speaking over an answer (VAD), holding the button, typing, or Stop
// cancels it: `response.cancel`, and what is still scheduled to play is silenced.
"use strict";

const talk = {
  ws: null,
  mic: null,           // {stream, ctx, node}
  ready: false,        // session.updated seen: the input rate is set, audio may go
  early: [],           // microphone pieces from before that
  outputRate: null,    // the model's speech rate (session.audio.output.format.rate)
  holding: false,      // push to talk: the button is down
  heldSamples: 0,      // samples sent during this hold
  sentSamples: 0,      // all input samples sent
  response: null,      // the reply being generated
  replies: [],         // every reply: {id, status, text, player, div}
  turns: [],           // server VAD turns: {started, stopped} (ms of the input timeline)
};

const talkMode = () => ($("talk-ptt").checked ? "ptt" : "vad");

function realtimeURL() {
  const url = new URL("/v1/realtime", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("model", card.id);
  return url.href;
}

function bytesBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function talkSend(event) {
  if (talk.ws && talk.ws.readyState === WebSocket.OPEN) talk.ws.send(JSON.stringify(event));
}

function talkBubble(role, text) {
  const div = Object.assign(document.createElement("div"), {className: `msg ${role}`});
  div.appendChild(Object.assign(document.createElement("span"), {className: "who", textContent: role}));
  div.appendChild(Object.assign(document.createElement("span"), {className: "text", textContent: text}));
  $("talk-log").appendChild(div);
  $("talk-log").scrollTop = $("talk-log").scrollHeight;
  return div;
}

function turnDetection() { return talkMode() === "vad" ? {type: "server_vad"} : null; }

function setTalking(on) {
  $("talk-start").textContent = on ? "Hang up" : "Start talking";
  $("talk-stop").disabled = !on;
  $("talk-text").disabled = !on;
  $("talk-hold").disabled = !on;
  $("talk-hold").classList.toggle("hidden", talkMode() !== "ptt");
}

async function startTalk() {
  showError("");
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia(
      {audio: {channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true}});
  } catch (e) {
    throw new Error(`Microphone: ${e.message} (allow the page to use it)`);
  }
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule("/static/talk-worklet.js");
  const node = new AudioWorkletNode(ctx, "pcm16-capture", {numberOfInputs: 1, numberOfOutputs: 1, channelCount: 1});
  ctx.createMediaStreamSource(stream).connect(node);
  node.connect(ctx.destination);  // pulled by the render loop (the tap's output is silent)
  node.port.onmessage = (ev) => onMicPiece(new Int16Array(ev.data));
  talk.mic = {stream, ctx, node};
  // a browser cannot set headers on a WebSocket: the key goes as a subprotocol, as OpenAI's browser clients send it
  const ws = new WebSocket(realtimeURL(), apiKey ? ["realtime", `openai-insecure-api-key.${apiKey}`] : []);
  talk.ws = ws;
  ws.onopen = () => talkSend({type: "session.update", session: {type: "realtime", audio: {input: {
    format: {type: "audio/pcm", rate: ctx.sampleRate}, turn_detection: turnDetection()}}}});
  ws.onmessage = (ev) => onServerEvent(JSON.parse(ev.data));
  ws.onclose = (ev) => {
    if (talk.ws !== ws) return;  // hung up here
    endTalk();
    setStatus(`the server closed the session (code ${ev.code})`);
  };
  setTalking(true);
  setStatus("connecting…");
}

function endTalk() {
  const {ws, mic} = talk;
  talk.ws = null;
  talk.mic = null;
  talk.ready = talk.holding = false;
  talk.early = [];
  if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
  if (mic) {
    for (const track of mic.stream.getTracks()) track.stop();
    mic.ctx.close();
  }
  if (talk.response) finishReply(talk.response, "cancelled");
  setTalking(false);
  $("talk-hold").classList.remove("held");
}

function onMicPiece(pcm) {
  if (talkMode() === "ptt" && !talk.holding) return;
  if (!talk.ready) { talk.early.push(pcm); return; }  // the first words, said while the session is set up
  talkSend({type: "input_audio_buffer.append", audio: bytesBase64(new Uint8Array(pcm.buffer))});
  talk.sentSamples += pcm.length;
  if (talk.holding) talk.heldSamples += pcm.length;
}

// Cut the answer short: generation stops in every stage (response.cancel), playback stops here.
function interrupt() {
  if (talk.response) talkSend({type: "response.cancel", response_id: talk.response.id});
  for (const reply of talk.replies) reply.player.stop();
}

function finishReply(reply, status) {
  reply.status = status;
  reply.div.dataset.status = status;
  reply.div.dataset.done = "true";
  if (status !== "completed") reply.div.querySelector(".who").textContent = `assistant (${status})`;
  if (talk.response === reply) talk.response = null;
}

function onServerEvent(ev) {
  const reply = talk.response;
  switch (ev.type) {
    case "session.created":
    case "session.updated": {
      const format = ev.session.audio.output.format;
      talk.outputRate = format ? format.rate : null;
      if (ev.type === "session.updated" && !talk.ready) {
        talk.ready = true;
        for (const pcm of talk.early.splice(0)) onMicPiece(pcm);
        setStatus(talkMode() === "vad" ? "listening: just talk" : "hold the button while you talk");
      }
      break;
    }
    case "input_audio_buffer.speech_started":
      talk.turns.push({started: ev.audio_start_ms, stopped: null});
      for (const r of talk.replies) r.player.stop();  // barge-in: the server cancels the answer itself
      setStatus("hearing you…");
      break;
    case "input_audio_buffer.speech_stopped":
      if (talk.turns.length) talk.turns[talk.turns.length - 1].stopped = ev.audio_end_ms;
      setStatus("thinking…");
      break;
    case "conversation.item.added":
      if (ev.item.role === "user") {
        const part = ev.item.content[0] || {};
        talkBubble("user", part.type === "input_audio" ? "(spoken)" : part.text || "");
      }
      break;
    case "response.created": {
      const div = talkBubble("assistant", "");
      div.dataset.done = "false";
      talk.response = {id: ev.response.id, status: "in_progress", text: "", player: new PcmPlayer(), div};
      talk.replies.push(talk.response);
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (!reply) break;
      reply.text += ev.delta;
      reply.div.querySelector(".text").textContent = reply.text;
      break;
    case "response.output_audio.delta":
      if (reply) reply.player.push(base64Bytes(ev.delta), talk.outputRate);
      break;
    case "response.done": {
      if (!reply) break;
      finishReply(reply, ev.response.status);
      if (reply.player.sampleCount) {
        reply.div.appendChild(Object.assign(document.createElement("audio"),
                                            {controls: true, src: URL.createObjectURL(reply.player.wav())}));
      }
      const usage = ev.response.usage || {};
      $("talk-info").textContent = `last answer: ${ev.response.status}` +
        (reply.player.rate ? ` · ${(reply.player.sampleCount / reply.player.rate).toFixed(2)} s of speech` : "") +
        (usage.output_tokens ? ` · ${usage.input_tokens} prompt, ${usage.output_tokens} output tokens` : "");
      setStatus(talkMode() === "vad" ? "listening: just talk" : "hold the button while you talk");
      break;
    }
    case "error":
      if (ev.error.code === "response_cancel_not_active") break;  // Stop as the answer ended: nothing to cut
      showError(`Error: ${describe(ev.error)}`);
      break;
    default:
      break;
  }
}

// ------------------------------------------------------------------ wiring

$("talk-start").addEventListener("click", () => {
  if (talk.ws) { endTalk(); setStatus("hung up"); return; }
  if (!card) { showError("The model card did not load; reload the page."); return; }
  startTalk().catch((e) => { endTalk(); showError(e.message); setStatus(""); });
});
$("talk-stop").addEventListener("click", interrupt);
for (const radio of document.querySelectorAll("input[name=talk-mode]")) {
  radio.addEventListener("change", () => {
    $("talk-hold").classList.toggle("hidden", talkMode() !== "ptt");
    if (talk.ws) talkSend({type: "session.update", session: {type: "realtime", audio: {input: {
      turn_detection: turnDetection()}}}});
  });
}
$("talk-hold").addEventListener("pointerdown", () => {
  if (!talk.ready) return;
  interrupt();  // talking over the answer
  talk.holding = true;
  talk.heldSamples = 0;
  $("talk-hold").classList.add("held");
  setStatus("listening… (release when done)");
});
for (const kind of ["pointerup", "pointerleave", "pointercancel"]) {
  $("talk-hold").addEventListener(kind, () => {
    if (!talk.holding) return;
    talk.holding = false;
    $("talk-hold").classList.remove("held");
    if (!talk.heldSamples) return;
    talkSend({type: "input_audio_buffer.commit"});
    talkSend({type: "response.create"});
    setStatus("thinking…");
  });
}
$("talk-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("talk-text").value.trim();
  if (!text || !talk.ready) return;
  interrupt();
  talkSend({type: "conversation.item.create", item: {type: "message", role: "user",
                                                     content: [{type: "input_text", text}]}});
  talkSend({type: "response.create"});
  $("talk-text").value = "";
});
