// The talk panel's microphone tap (an AudioWorklet: it runs on the audio thread, so no sample is dropped while
// the page is busy): float samples in, 16-bit PCM out in 100 ms pieces, posted to the page.
"use strict";

class Pcm16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round(sampleRate / 10);
    this.piece = new Int16Array(this.size);
    this.filled = 0;
  }

  process(inputs) {
    const channel = (inputs[0] || [])[0];  // mono: the first channel
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      const s = Math.max(-1, Math.min(1, channel[i]));
      this.piece[this.filled++] = Math.round(s < 0 ? s * 32768 : s * 32767);
      if (this.filled === this.piece.length) {
        this.port.postMessage(this.piece.buffer, [this.piece.buffer]);  // transferred: a new piece follows
        this.piece = new Int16Array(this.size);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
