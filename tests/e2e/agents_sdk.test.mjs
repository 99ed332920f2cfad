// agents_sdk.test.mjs — OpenAI's Agents SDK (@openai/agents) runs an agent
// with one function tool and a handoff to a second agent against kvstash,
// to completion: over Chat Completions, and over the Responses API (the
// SDK's default), streamed and not.
//
// Random weights never choose a tool by themselves, so the agents name what
// they must call (modelSettings.toolChoice): the first agent hands off, the
// second calls its tool; the SDK then resets tool_choice to auto (its
// resetToolChoice default) and the second agent answers in text, which ends
// the run.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, importClient, templateModel } from './lib.mjs';

let srv, dir;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-agents-'));
  const model = templateModel(dir);
  srv = await startServer(['-m', model, '--ctx', '4096', '--slots', '2', '--max-tokens', '48']);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function runAgents(api, stream) {
  const { Agent, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } =
    await importClient('@openai/agents');
  const OpenAI = (await importClient('openai')).default;
  const { z } = await importClient('zod');
  setTracingDisabled(true);
  setOpenAIAPI(api);
  setDefaultOpenAIClient(new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 }));

  const calls = [];
  const getWeather = tool({
    name: 'get_weather',
    description: 'The current weather of a city',
    parameters: z.object({ city: z.enum(['Paris', 'Rome', 'Oslo']) }),
    execute: async ({ city }) => {
      calls.push(city);
      return `${city}: sunny, 21 C`;
    },
  });
  const weather = new Agent({
    name: 'weather_agent',
    instructions: 'You answer weather questions with the get_weather tool.',
    tools: [getWeather],
    modelSettings: { toolChoice: 'get_weather', temperature: 0, maxTokens: 200, parallelToolCalls: false },
  });
  const triage = Agent.create({
    name: 'triage_agent',
    instructions: 'Hand weather questions to the weather agent.',
    handoffs: [weather],
    modelSettings: { toolChoice: 'transfer_to_weather_agent', temperature: 0, maxTokens: 200, parallelToolCalls: false },
  });

  const result = await run(triage, 'What is the weather in Paris?', { maxTurns: 6, stream });
  if (stream) {
    let events = 0;
    for await (const ev of result) if (ev) events++; // eslint-disable-line no-unused-vars
    await result.completed;
    assert.ok(events > 0, 'the run streamed events');
  }
  assert.equal(result.lastAgent.name, 'weather_agent');
  const kinds = result.newItems.map((i) => i.type);
  assert.ok(kinds.includes('handoff_call_item'), kinds.join(','));
  assert.ok(kinds.includes('handoff_output_item'), kinds.join(','));
  assert.ok(kinds.includes('tool_call_item'), kinds.join(','));
  assert.ok(kinds.includes('tool_call_output_item'), kinds.join(','));
  assert.equal(calls.length, 1);
  assert.ok(['Paris', 'Rome', 'Oslo'].includes(calls[0]));
  assert.equal(typeof result.finalOutput, 'string');
}

test('an agent with a function tool and a handoff runs to completion (Chat Completions)', () =>
  runAgents('chat_completions', false));
test('the same agent over the Responses API', () => runAgents('responses', false));
test('the same agent over the Responses API, streamed', () => runAgents('responses', true));
