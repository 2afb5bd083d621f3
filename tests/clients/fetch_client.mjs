// A Node client the end-to-end tests run through wiretape: `node fetch_client.mjs SCENARIO URL`.
//
// It uses only what Node has built in (fetch() and the https/http modules), none of which
// honour HTTPS_PROXY before Node 24: the point is that wiretape's preload makes them. Prints
// one JSON line per result, so a recorded run and a replayed one compare line for line.
import http from 'node:http';
import https from 'node:https';

const [scenario, url] = process.argv.slice(2);

function emit(fields) {
  console.log(JSON.stringify(fields));
}

async function fetchChat() {
  const answer = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${process.env.OPENAI_API_KEY}`,
    },
    body: JSON.stringify({
      model: 'gpt-4o-mini',
      messages: [{ role: 'user', content: 'Hello from fetch' }],
    }),
  });
  const reply = await answer.json();
  emit({ kind: 'chat', status: answer.status, content: reply.choices[0].message.content });
}

async function fetchStream() {
  const answer = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'gpt-4o-mini',
      stream: true,
      messages: [{ role: 'user', content: 'Stream from fetch' }],
    }),
  });
  const decoder = new TextDecoder();
  let text = '';
  for await (const chunk of answer.body) text += decoder.decode(chunk, { stream: true });
  const pieces = text
    .split('\n\n')
    .filter((event) => event.startsWith('data: {'))
    .map((event) => JSON.parse(event.slice(6)).choices[0]?.delta?.content ?? null);
  emit({ kind: 'stream', status: answer.status, pieces });
}

function moduleGet() {
  const client = url.startsWith('https:') ? https : http;
  return new Promise((resolve, reject) => {
    client
      .get(`${url}/fake/json?size=300`, (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (data) => {
          body += data;
        });
        response.on('end', () => {
          emit({ kind: 'module-get', status: response.statusCode, size: body.length });
          resolve();
        });
      })
      .on('error', reject);
  });
}

const scenarios = {
  'fetch-chat': fetchChat,
  'fetch-stream': fetchStream,
  'module-get': moduleGet,
  all: async () => {
    await fetchChat();
    await fetchStream();
    await moduleGet();
  },
};

await scenarios[scenario]();
