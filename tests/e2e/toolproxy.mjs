// toolproxy.mjs — a test-side HTTP proxy in front of the real server that
// turns chosen replies into tool calls, so that the real agent CLIs run a
// tool round trip against a random-weight model (which never calls a tool of
// its own accord).
//
// Every request goes to the server as the client sent it, and the server
// serves it in full (its log, its counters and its cache see exactly what
// they would without the proxy). For a request the plan picks, the proxy then
// drops the server's reply and answers with a tool call in the request's own
// wire format — Anthropic Messages, OpenAI Responses or Chat Completions,
// streamed or not — as the hosted APIs write them. Every other reply is passed
// through byte for byte.
//
//   const px = await startToolProxy(srv, plan);   // px.base: the URL to give the client
//   plan({ api, path, body, index }) -> null (pass through) | [{ name, input }] (tool calls;
//                                         input an object, or a string for a custom tool)
//   px.log: [{ path, status, api, scripted, body }] per request, in order.
//   await px.close();
import http from 'node:http';
import { randomBytes } from 'node:crypto';

const hex = (n) => randomBytes(n).toString('hex');

export function apiOf(path) {
  const p = path.split('?')[0];
  if (/\/messages$/.test(p)) return 'messages';
  if (/\/responses$/.test(p)) return 'responses';
  if (/\/chat\/completions$/.test(p)) return 'chat';
  return null;
}

function sse(res, event, obj) {
  res.write(`${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(obj)}\n\n`);
}

// ------------------------------------------------------------ Anthropic Messages
function messagesReply(res, body, calls) {
  const id = `msg_${hex(12)}`;
  const blocks = calls.map((c) => ({ type: 'tool_use', id: `toolu_${hex(12)}`, name: c.name, input: c.input }));
  const usage = { input_tokens: 1, output_tokens: 1, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model: body.model, content: blocks,
      stop_reason: 'tool_use', stop_sequence: null, usage }));
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  sse(res, 'message_start', { type: 'message_start', message: { id, type: 'message', role: 'assistant', model: body.model,
    content: [], stop_reason: null, stop_sequence: null, usage } });
  blocks.forEach((b, index) => {
    sse(res, 'content_block_start', { type: 'content_block_start', index, content_block: { ...b, input: {} } });
    sse(res, 'content_block_delta', { type: 'content_block_delta', index,
      delta: { type: 'input_json_delta', partial_json: JSON.stringify(b.input) } });
    sse(res, 'content_block_stop', { type: 'content_block_stop', index });
  });
  sse(res, 'message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null },
    usage: { output_tokens: 1 } });
  sse(res, 'message_stop', { type: 'message_stop' });
  res.end();
}

// ------------------------------------------------------------ OpenAI Responses
function responsesReply(res, body, calls) {
  const id = `resp_${hex(12)}`;
  const created_at = Math.floor(Date.now() / 1000);
  const items = calls.map((c) => (typeof c.input === 'string'
    ? { type: 'custom_tool_call', id: `ctc_${hex(12)}`, call_id: `call_${hex(12)}`, name: c.name, input: c.input,
      status: 'completed' }
    : { type: 'function_call', id: `fc_${hex(12)}`, call_id: `call_${hex(12)}`, name: c.name,
      arguments: JSON.stringify(c.input), status: 'completed' }));
  const usage = { input_tokens: 1, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1,
    output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 2 };
  const resp = (status, output) => ({ id, object: 'response', created_at, status, model: body.model, output,
    parallel_tool_calls: true, tool_choice: body.tool_choice ?? 'auto', tools: [], usage: status === 'completed' ? usage : null,
    error: null, incomplete_details: null });
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify(resp('completed', items)));
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let seq = 0;
  const ev = (type, o) => sse(res, type, { type, sequence_number: seq++, ...o });
  ev('response.created', { response: resp('in_progress', []) });
  ev('response.in_progress', { response: resp('in_progress', []) });
  items.forEach((it, output_index) => {
    if (it.type === 'custom_tool_call') {
      ev('response.output_item.added', { output_index, item: { ...it, input: '', status: 'in_progress' } });
      ev('response.custom_tool_call_input.delta', { output_index, item_id: it.id, delta: it.input });
      ev('response.custom_tool_call_input.done', { output_index, item_id: it.id, input: it.input });
    } else {
      ev('response.output_item.added', { output_index, item: { ...it, arguments: '', status: 'in_progress' } });
      ev('response.function_call_arguments.delta', { output_index, item_id: it.id, delta: it.arguments });
      ev('response.function_call_arguments.done', { output_index, item_id: it.id, arguments: it.arguments });
    }
    ev('response.output_item.done', { output_index, item: it });
  });
  ev('response.completed', { response: resp('completed', items) });
  res.end();
}

// ------------------------------------------------------------ Chat Completions
function chatReply(res, body, calls) {
  const id = `chatcmpl-${hex(12)}`;
  const created = Math.floor(Date.now() / 1000);
  const tcs = calls.map((c, index) => ({ index, id: `call_${hex(12)}`, type: 'function',
    function: { name: c.name, arguments: JSON.stringify(c.input) } }));
  const usage = { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ id, object: 'chat.completion', created, model: body.model,
      choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: tcs.map(({ index, ...t }) => t) },
        finish_reason: 'tool_calls' }], usage }));
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const chunk = (delta, finish_reason, extra = {}) => sse(res, null, { id, object: 'chat.completion.chunk', created,
    model: body.model, choices: [{ index: 0, delta, finish_reason }], ...extra });
  chunk({ role: 'assistant', content: null, tool_calls: tcs }, null);
  chunk({}, 'tool_calls');
  if (body.stream_options?.include_usage)
    sse(res, null, { id, object: 'chat.completion.chunk', created, model: body.model, choices: [], usage });
  res.write('data: [DONE]\n\n');
  res.end();
}

const REPLY = { messages: messagesReply, responses: responsesReply, chat: chatReply };

export async function startToolProxy(srv, plan) {
  const target = new URL(srv.base);
  const log = [];
  let index = 0;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (d) => chunks.push(d));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const api = req.method === 'POST' ? apiOf(req.url) : null;
      let body = null;
      try { body = api && raw.length ? JSON.parse(raw) : null; } catch { body = null; }
      const entry = { path: req.url, method: req.method, api, scripted: false, status: 0, body };
      log.push(entry);
      const calls = api && body ? plan({ api, path: req.url, body, index: index++ }) : null;
      const headers = { ...req.headers, host: target.host };
      delete headers['content-length'];
      const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url,
        headers: { ...headers, 'content-length': raw.length } }, (ur) => {
        entry.status = ur.statusCode;
        if (!calls || ur.statusCode !== 200) {
          res.writeHead(ur.statusCode, ur.headers);
          ur.pipe(res);
          return;
        }
        // The server's reply runs to its end (its slot, its log line), then the scripted one goes out.
        ur.resume();
        ur.on('end', () => { entry.scripted = true; REPLY[api](res, body, calls); });
      });
      up.on('error', (e) => { entry.status = 502; res.writeHead(502); res.end(String(e)); });
      up.end(raw);
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = server.address().port;
  return {
    base: `http://127.0.0.1:${port}`,
    log,
    close: () => new Promise((resolve) => { server.closeAllConnections?.(); server.close(() => resolve()); }),
  };
}
