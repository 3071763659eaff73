// The client side of serve_test: OpenAI's own Node client (the `openai` npm package, installed by
// scripts/setup.sh into .fixtures/npm) sends one chat completion with an image — a PNG as a
// data: URL — and a question, greedy, to `trainctl-trainer serve`, and prints what came back as
// one JSON line: {"id", "model", "text", "finish_reason", "token_ids", "usage", "models"}
// ("models": the ids /v1/models lists, through the same client).
//
//   node chat_client.cjs NODE_MODULES_DIR BASE_URL MODEL PNG_FILE QUESTION MAX_TOKENS
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [modulesDir, baseURL, model, pngFile, question, maxTokens] = process.argv.slice(2);
if (!maxTokens) {
  console.error("usage: node chat_client.cjs NODE_MODULES_DIR BASE_URL MODEL PNG QUESTION MAX");
  process.exit(2);
}
const OpenAI = createRequire(path.join(modulesDir, "resolve.js"))("openai").default;

async function main() {
  const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120000 });
  const png = fs.readFileSync(pngFile).toString("base64");
  const completion = await client.chat.completions.create({
    model,
    messages: [
      {
        role: "user",
        content: [
          { type: "image_url", image_url: { url: `data:image/png;base64,${png}` } },
          { type: "text", text: question },
        ],
      },
    ],
    temperature: 0,
    max_tokens: Number(maxTokens),
  });
  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  const choice = completion.choices[0];
  console.log(JSON.stringify({
    id: completion.id,
    model: completion.model,
    text: choice.message.content,
    finish_reason: choice.finish_reason,
    token_ids: choice.token_ids,
    usage: completion.usage,
    models,
  }));
}

main().catch((err) => {
  console.error(`chat_client: ${err.stack || err}`);
  process.exit(1);
});
