// tensor_parallel_bench: Megatron-style tensor parallelism of the decoder MLP (gate_proj/up_proj
// column parallel, down_proj row parallel; model/tensor_parallel.h), alone and beside
// DeepSpeed-Ulysses sequence parallelism, on CPU ranks.
//
// Two tables. First, tiny (configs/models/tiny: hidden 64, MLP 0.5% of the weights) for the meshes
// (tp, sp) = (1,1), (2,1), (1,2), (2,2), (4,1) (world tp x sp, one data-parallel group) and prompts
// of about --lengths tokens. Second, an MLP-heavy model the bench writes into --work/mlp-model
// (tiny's config with hidden 256, intermediate 8192, 4 layers, 4 heads / 2 key/value heads,
// mrope_section [8,12,12] for head_dim 64, vision_config.hidden_size 256 (Qwen2-VL's merger
// output, which must equal the text hidden size); no weights, so it is built from the seed) for
// (1,1), (2,1), (4,1) at --mlp_lengths. Each run is real `trainctl-trainer train` ranks of SFT
// (eager attention, fp32, ZeRO stage 0, batch 1, no gradient checkpointing); the bench prints
// for rank 0: the step time, the peak memory above the model states (the `memory` event's
// peak_bytes less its master, optimizer and gradient bytes) and its ratio to (1,1) at the same
// length, master_bytes, the decoder MLP's fp32 weights per rank from the config (layers x 3 x
// hidden x intermediate x 4 / tp), and the bytes each group sent per step against the communication
// models (the tensor group's model also split into its MLP all-reduces and its replicated
// gradients' all-reduces), which read layers, hidden size and heads from the run's config (Comm
// counts an all-reduce as 2 x RingBytes = 2 x floor(bytes x (T - 1) / T) per rank, the
// reduce-scatter and all-gather halves of a ring; an all-to-all as RingBytes of its input):
//
//   tensor group (T = tp): per decoder layer and micro-batch, 2 all-reduces of [B, L, hidden]
//   fp32 (g's forward sum of the MLP's output, f's backward sum of its input's gradient; a third
//   in backward with gradient checkpointing, off here), L = ceil(S / sp) the rank's slice of the
//   row; plus, per step, the all-reduce of the sliced weights' squared gradient norm (1 fp64);
//   plus, per step and engine unit, one all-reduce of the unit's replicated weights' gradients
//   (Engine::AverageReplicatedGradients: every weight but the decoder MLP's gate/up/down_proj,
//   no vocab_parallel here; fp32, whole at ZeRO stage 0, so each is a unit's replicated count x 4
//   bytes, floored per unit). The units (Units()) and their replicated counts, from the config
//   (E = vision embed_dim, M = E x mlp_ratio, P = in_chans x temporal_patch_size x patch_size^2,
//   D = E x spatial_merge_size^2, O = vision hidden_size, H = hidden, K = kv heads x head_dim):
//     model.embed_tokens  vocab x H
//     visual.patch_embed  E x P (Conv3d, no bias)
//     visual.blocks.N     norm1, norm2 (LayerNorm, 2E each), attn.qkv 3E x E + 3E,
//                         attn.proj E x E + E, mlp.fc1 M x E + M, mlp.fc2 E x M + E
//     visual.merger       ln_q 2E, mlp.0 D x D + D, mlp.2 O x D + O
//     model.layers.N      q_proj H x H + H, k_proj and v_proj K x H + K each, o_proj H x H,
//                         input_layernorm and post_attention_layernorm H each
//     head                model.norm H (tied: the embedding is borrowed), plus lm_head vocab x H
//                         when not tied
//   sequence group: the model of sequence_parallel_bench (all-to-alls of q, k, v and the attention
//   output per layer forward and again in backward, (sp - 1) / sp of each slice; the last hidden
//   states gathered whole, forward and backward; fp32).
//
// The MLP model's master bytes per rank should fall by about its MLP x (1 - 1/tp) (4 x 3 x 256 x
// 8192 x 4 bytes = 96 MiB); its activation peak a little (the MLP's intermediates are 1/tp), but
// on CPU the peak is a resident-set high-water mark and follows this loosely (bench/README.md).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/mesh_bench.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, lengths, "1024,4096",
          "tiny's prompt lengths in words (about one token each)");
ABSL_FLAG(std::string, mlp_lengths, "256", "the MLP-heavy model's prompt lengths in words");
ABSL_FLAG(int, steps, 3, "steps per run (the first is not timed)");
ABSL_FLAG(std::string, work, "/tmp/tensor_parallel_bench", "scratch folder");

namespace {

namespace fs = std::filesystem;
namespace bench = trainctl::bench;
using nlohmann::json;

json ReadTpConfig(const std::string& path) {
  std::ifstream in(path);
  json config = json::parse(in, nullptr, false);
  if (!config.is_object()) {
    std::cerr << "cannot read " << path << "\n";
    std::exit(1);
  }
  return config;
}

// The sizes the models above read from a run's config.json.
bench::ModelSizes TpShapeOf(const json& config) {
  bench::ModelSizes s;
  s.layers = config["num_hidden_layers"].get<int64_t>();
  s.hidden = config["hidden_size"].get<int64_t>();
  s.intermediate = config["intermediate_size"].get<int64_t>();
  s.kv_heads = config["num_key_value_heads"].get<int64_t>();
  s.head_dim = s.hidden / config["num_attention_heads"].get<int64_t>();
  return s;
}

// Writes the MLP-heavy model (the header) into work/mlp-model and returns that folder: a
// config.json and no weights, which the trainer builds from the seed.
std::string WriteMlpModel(const std::string& work) {
  json config = ReadTpConfig(absl::StrCat(TRAINCTL_SOURCE_DIR, "/configs/models/tiny/config.json"));
  config["hidden_size"] = 256;
  config["intermediate_size"] = 8192;
  config["num_hidden_layers"] = 4;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["rope_scaling"]["mrope_section"] = {8, 12, 12};  // sums to head_dim / 2 = 32
  config["vision_config"]["hidden_size"] = 256;           // the merger's output: text hidden_size
  const std::string dir = absl::StrCat(work, "/mlp-model");
  fs::create_directories(dir);
  std::ofstream(absl::StrCat(dir, "/config.json")) << config.dump(2) << "\n";
  return dir;
}

// Runs the tp x sp ranks of one run and reads rank 0's events.
bench::RankEvents RunTp(const std::string& work, const std::string& tag, const std::string& model,
                        const std::string& shards, int words, int tp, int sp, int steps) {
  bench::MeshRun run;
  run.name = absl::StrCat(tag, "-tp", tp, "sp", sp, "-", words);
  run.model = model;
  run.shards = shards;
  run.parallelism = {{"tensor_parallel_size", tp}, {"sequence_parallel_size", sp}};
  run.world = tp * sp;
  run.words = words;
  run.steps = steps;
  run.port_base = 29811;
  return bench::RunSftRanks(work, run);
}

// Comm's count for one all-reduce of `bytes` over `world` ranks (comm.cc: 2 x RingBytes).
int64_t TpAllReduceBytes(int64_t bytes, int world) { return 2 * (bytes * (world - 1) / world); }

// Each engine unit's replicated parameter count (the header's list), in Units() order, for
// `config` without vocab_parallel.
std::vector<int64_t> ReplicatedUnitNumels(const json& config) {
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const int64_t kv = config["num_key_value_heads"].get<int64_t>() * (hidden / heads);
  const int64_t vocab = config["vocab_size"].get<int64_t>();
  const json& v = config["vision_config"];
  const int64_t e = v["embed_dim"].get<int64_t>();
  const int64_t m = static_cast<int64_t>(e * v.value("mlp_ratio", 4.0));
  const int64_t p = v.value("patch_size", int64_t{14});
  const int64_t patch =
      v.value("in_chans", int64_t{3}) * v.value("temporal_patch_size", int64_t{2}) * p * p;
  const int64_t merge = v.value("spatial_merge_size", int64_t{2});
  const int64_t d = e * merge * merge;
  const int64_t out = v["hidden_size"].get<int64_t>();
  std::vector<int64_t> units = {vocab * hidden, e * patch};
  const int64_t block =
      2 * e + 2 * e + (3 * e * e + 3 * e) + (e * e + e) + (m * e + m) + (e * m + e);
  for (int64_t i = 0; i < v["depth"].get<int64_t>(); ++i) units.push_back(block);
  units.push_back(2 * e + (d * d + d) + (out * d + out));
  const int64_t layer =
      (hidden * hidden + hidden) + 2 * (kv * hidden + kv) + hidden * hidden + 2 * hidden;
  for (int64_t i = 0; i < config["num_hidden_layers"].get<int64_t>(); ++i) units.push_back(layer);
  const bool tied = config.value("tie_word_embeddings", false);
  units.push_back(hidden + (tied ? 0 : vocab * hidden));
  return units;
}

// The tensor group's model above, per rank and step, for one row of `tokens` (padded to sp),
// split into the activations' all-reduces, the norm's and the replicated gradients'.
struct TensorModel {
  int64_t activations = 0, norm = 0, replicated = 0;
  double total() const { return static_cast<double>(activations + norm + replicated); }
};

TensorModel TensorModelBytes(const bench::ModelSizes& m, const std::vector<int64_t>& replicated,
                             int tp, int sp, int64_t tokens) {
  TensorModel out;
  if (tp == 1) return out;
  const int64_t slice = (tokens + sp - 1) / sp;
  out.activations = m.layers * 2 * TpAllReduceBytes(4 * slice * m.hidden, tp);
  out.norm = TpAllReduceBytes(8, tp);
  for (int64_t numel : replicated) out.replicated += TpAllReduceBytes(4 * numel, tp);
  return out;
}

double TpRatio(double sent, double model) { return model > 0 ? sent / model : 0; }

// One table: every mesh at every length of `lengths`, for the model `model` (a registry name or
// a folder with a config.json) whose config is `config`.
void RunTpTable(const std::string& work, const std::string& tag, const std::string& model,
                const json& config, const std::string& lengths,
                const std::vector<std::pair<int, int>>& meshes) {
  if (lengths.empty()) return;
  const bench::ModelSizes shape = TpShapeOf(config);
  const std::vector<int64_t> replicated = ReplicatedUnitNumels(config);
  const int steps = absl::GetFlag(FLAGS_steps);
  absl::PrintF(
      "tensor_parallel_bench: %s (hidden %d, intermediate %d, %d layers), CPU ranks, fp32, "
      "eager attention, batch 1\n",
      tag, shape.hidden, shape.intermediate, shape.layers);
  absl::PrintF("%6s %2s %2s %8s %10s %8s %10s %8s %12s %12s %6s %12s %12s %12s %12s %6s\n", "words",
               "tp", "sp", "step s", "peak-st MiB", "vs 1x1", "master MiB", "MLP MiB", "tp B/step",
               "tp model", "ratio", "of it: MLP", "replicated", "sp B/step", "sp model", "ratio");
  for (absl::string_view text : absl::StrSplit(lengths, ',')) {
    int words = 0;
    if (!absl::SimpleAtoi(text, &words)) continue;
    const std::string shards = bench::PrepareLongPrompts(work, words);
    double base = 0;
    for (const auto& [tp, sp] : meshes) {
      const bench::RankEvents r = RunTp(work, tag, model, shards, words, tp, sp, steps);
      if (tp == 1 && sp == 1) base = r.peak_above_states;
      const int64_t tokens_per_row = static_cast<int64_t>(r.row_tokens + 0.5);
      const TensorModel tp_parts = TensorModelBytes(shape, replicated, tp, sp, tokens_per_row);
      const double tp_model = tp_parts.total();
      const double sp_model = bench::SequenceModelBytes(shape, sp, tokens_per_row);
      const double mlp_mib =
          4.0 * 3 * shape.layers * shape.hidden * shape.intermediate / tp / (1 << 20);
      absl::PrintF(
          "%6d %2d %2d %8.3f %11.1f %8.3f %10.3f %8.3f %12.0f %12.0f %6.3f %12d %12d %12.0f %12.0f "
          "%6.3f\n",
          words, tp, sp, r.step_seconds, r.peak_above_states / (1 << 20),
          base > 0 ? r.peak_above_states / base : 0, r.master_bytes / (1 << 20), mlp_mib,
          r.tensor_bytes_per_step, tp_model, TpRatio(r.tensor_bytes_per_step, tp_model),
          tp_parts.activations, tp_parts.replicated, r.sequence_bytes_per_step, sp_model,
          TpRatio(r.sequence_bytes_per_step, sp_model));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string work = absl::GetFlag(FLAGS_work);
  fs::create_directories(work);
  const json tiny =
      ReadTpConfig(absl::StrCat(TRAINCTL_SOURCE_DIR, "/configs/models/tiny/config.json"));
  RunTpTable(work, "tiny", "tiny", tiny, absl::GetFlag(FLAGS_lengths),
             {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}});
  const std::string mlp_dir = WriteMlpModel(work);
  RunTpTable(work, "mlp", mlp_dir, ReadTpConfig(absl::StrCat(mlp_dir, "/config.json")),
             absl::GetFlag(FLAGS_mlp_lengths), {{1, 1}, {2, 1}, {4, 1}});
  return 0;
}
