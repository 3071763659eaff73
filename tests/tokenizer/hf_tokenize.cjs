// Reference side of the tokenizer parity test: encodes every line of a corpus (each line a JSON
// string) with @huggingface/tokenizers, the pure-JS implementation of HF's tokenizers, and prints
// one JSON object per line: {"ids": [...], "text": decode(ids)}. Timing goes to stderr.
//
//   node hf_tokenize.cjs NODE_MODULES_DIR TOKENIZER_DIR CORPUS
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [modulesDir, tokenizerDir, corpusPath] = process.argv.slice(2);
if (!corpusPath) {
  console.error("usage: node hf_tokenize.cjs NODE_MODULES_DIR TOKENIZER_DIR CORPUS");
  process.exit(2);
}
const { Tokenizer } = createRequire(path.join(modulesDir, "resolve.js"))("@huggingface/tokenizers");
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(tokenizerDir, name), "utf8"));
const tokenizer = new Tokenizer(readJson("tokenizer.json"), readJson("tokenizer_config.json"));

const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0);
const texts = lines.map((l) => JSON.parse(l));
const started = process.hrtime.bigint();
const encoded = texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }).ids);
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
const out = encoded.map((ids) => {
  const text = ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: false });
  return JSON.stringify({ ids, text });
});
process.stdout.write(out.join("\n") + "\n");
console.error(`hf_tokenize: ${texts.length} lines, ${bytes} bytes encoded in ${seconds.toFixed(3)} s`);
