// media.mjs — test images and audio for the media tests (media*.test.mjs):
// real PNG, BMP and WAV files made here, deterministic from a seed, and the
// shapes each API sends them in.
import { deflateSync } from 'node:zlib';

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'ascii'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}

// A w x h RGB PNG whose pixels come from seed (a "screenshot": bands of
// colour with a pattern), decodable by any decoder.
export function png(w, h, seed = 1) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; // depth
  ihdr[9] = 2; // RGB
  const raw = Buffer.alloc((w * 3 + 1) * h);
  let s = seed >>> 0 || 1;
  for (let y = 0; y < h; y++) {
    raw[y * (w * 3 + 1)] = 0; // filter: none
    for (let x = 0; x < w; x++) {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      const o = y * (w * 3 + 1) + 1 + x * 3;
      raw[o] = (x * 7 + seed * 40) & 0xff;
      raw[o + 1] = (y * 5 + (s >>> 24)) & 0xff;
      raw[o + 2] = ((x ^ y) + seed * 13) & 0xff;
    }
  }
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([sig, chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

// A PNG header claiming w x h with no pixel data after it: an image the
// header checks pass and a decoder refuses (a corrupt file).
export function pngHeaderOnly(w, h) {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8;
  ihdr[9] = 2;
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr)]);
}

// Mono 16-bit PCM WAV of n samples at rate, a tone from seed.
export function wav(n = 16000, rate = 16000, seed = 1) {
  const data = Buffer.alloc(n * 2);
  for (let i = 0; i < n; i++) data.writeInt16LE(Math.round(8000 * Math.sin((i * (200 + seed * 50) * 2 * Math.PI) / rate)), i * 2);
  const h = Buffer.alloc(44);
  h.write('RIFF', 0);
  h.writeUInt32LE(36 + data.length, 4);
  h.write('WAVEfmt ', 8);
  h.writeUInt32LE(16, 16);
  h.writeUInt16LE(1, 20);
  h.writeUInt16LE(1, 22);
  h.writeUInt32LE(rate, 24);
  h.writeUInt32LE(rate * 2, 28);
  h.writeUInt16LE(2, 32);
  h.writeUInt16LE(16, 34);
  h.write('data', 36);
  h.writeUInt32LE(data.length, 40);
  return Buffer.concat([h, data]);
}

export const dataUrl = (buf, mime = 'image/png') => `data:${mime};base64,${buf.toString('base64')}`;

// One image in each API's shape.
export const chatImage = (buf, mime = 'image/png') => ({ type: 'image_url', image_url: { url: dataUrl(buf, mime) } });
export const chatAudio = (buf, format = 'wav') => ({ type: 'input_audio', input_audio: { data: buf.toString('base64'), format } });
export const respImage = (buf, mime = 'image/png') => ({ type: 'input_image', image_url: dataUrl(buf, mime) });
export const msgImage = (buf, mediaType = 'image/png') => ({
  type: 'image', source: { type: 'base64', media_type: mediaType, data: buf.toString('base64') },
});
