// concurrency.test.mjs — many conversations on few slots: all complete, and
// each reply is what the same conversation gets when run alone.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, chat, stream, getJSON } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--slots', '2', '--max-queue', '64']); });
after(async () => { if (srv) await stopOk(srv); });

const N_CONV = 8;
const N_TURNS = 3;
const topics = ['cats', 'rivers', 'the moon', 'bread', 'trains', 'music', 'snow', 'gardens'];

// One conversation, turn by turn; streamed on odd turns of odd conversations so
// both response paths run under load.
async function conversation(k) {
  const msgs = [{ role: 'system', content: `You talk about ${topics[k]}.` }];
  const replies = [];
  for (let t = 0; t < N_TURNS; t++) {
    msgs.push({ role: 'user', content: `Tell me fact ${t + 1} about ${topics[k]}.` });
    let reply;
    if ((k + t) % 2 === 1) {
      const s = await stream(srv, '/v1/chat/completions', { messages: msgs, temperature: 0, max_tokens: 20 });
      assert.equal(s.status, 200);
      assert.ok(s.done, 'stream ended with [DONE]');
      reply = s.text;
    } else {
      const r = await chat(srv, msgs, { max_tokens: 20 });
      reply = r.choices[0].message.content;
    }
    msgs.push({ role: 'assistant', content: reply });
    replies.push(reply);
  }
  return replies;
}

test(`${N_CONV} concurrent conversations x ${N_TURNS} turns on 2 slots equal their sequential runs`, async () => {
  const sequential = [];
  for (let k = 0; k < N_CONV; k++) sequential.push(await conversation(k));
  const concurrent = await Promise.all([...Array(N_CONV).keys()].map((k) => conversation(k)));
  for (let k = 0; k < N_CONV; k++) {
    for (let t = 0; t < N_TURNS; t++) {
      assert.equal(concurrent[k][t], sequential[k][t], `conversation ${k} turn ${t + 1}`);
    }
  }
  const slots = await getJSON(srv, '/slots');
  assert.equal(slots.json.length, 2);
  assert.ok(slots.json.every((s) => !s.busy), 'all slots idle at the end');
});

test('a burst of identical requests all succeed with identical text', async () => {
  const msgs = [{ role: 'user', content: 'Same question for everyone.' }];
  const rs = await Promise.all([...Array(6).keys()].map(() => chat(srv, msgs, { max_tokens: 12 })));
  for (const r of rs) assert.equal(r.choices[0].message.content, rs[0].choices[0].message.content);
});
