// WebSocket over HTTP/2 (RFC 8441) with Node's own http2 client, for upkeep's upgrade tests.
// usage: node h2_ws_client.js PORT PATH [CA_FILE]   (with CA_FILE: TLS, ALPN h2, name upkeep.test)
// Waits for the server's SETTINGS_ENABLE_CONNECT_PROTOCOL, opens an extended CONNECT with
// :protocol websocket, sends one masked text frame and a close frame (4003 "h2 bye"), and
// prints one JSON line: the status, the echoed text, and the close frame the server sent back.
'use strict';
const http2 = require('http2');
const crypto = require('crypto');
const fs = require('fs');

const [port, path, ca] = process.argv.slice(2);
const out = (o) => { console.log(JSON.stringify(o)); process.exit(0); };
setTimeout(() => out({ error: 'timed out' }), 10000).unref();

function frame(opcode, payload) {
  const mask = crypto.randomBytes(4);
  const head = Buffer.from([0x80 | opcode, 0x80 | payload.length]);
  const body = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
  return Buffer.concat([head, mask, body]);
}

const client = ca
  ? http2.connect(`https://127.0.0.1:${port}`, { ca: fs.readFileSync(ca), servername: 'upkeep.test' })
  : http2.connect(`http://127.0.0.1:${port}`);
client.on('error', (e) => out({ error: String(e) }));
client.once('remoteSettings', (settings) => {
  if (!settings.enableConnectProtocol) return out({ error: 'no SETTINGS_ENABLE_CONNECT_PROTOCOL' });
  const req = client.request({
    ':method': 'CONNECT',
    ':protocol': 'websocket',
    ':scheme': ca ? 'https' : 'http',
    ':path': path,
    ':authority': 'a.test',
    'sec-websocket-version': '13',
  });
  const result = {};
  let buf = Buffer.alloc(0);
  req.on('response', (headers) => {
    result.status = headers[':status'];
    result.accept = headers['sec-websocket-accept'] || null;
    req.write(frame(0x1, [...Buffer.from('hello over h2')]));
  });
  req.on('data', (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 2 && buf.length >= 2 + (buf[1] & 0x7f)) {
      const opcode = buf[0] & 0x0f;
      const len = buf[1] & 0x7f;
      const payload = buf.subarray(2, 2 + len);
      buf = buf.subarray(2 + len);
      if (opcode === 0x1) {
        result.echo = payload.toString();
        const reason = Buffer.from('h2 bye');
        const close = Buffer.concat([Buffer.from([4003 >> 8, 4003 & 0xff]), reason]);
        req.write(frame(0x8, [...close]));
      } else if (opcode === 0x8) {
        result.close_code = payload.readUInt16BE(0);
        result.close_reason = payload.subarray(2).toString();
        req.end();
        client.close();
        return out(result);
      }
    }
  });
  req.on('error', (e) => out({ ...result, error: String(e) }));
  req.on('end', () => out({ ...result, ended: true }));
});
