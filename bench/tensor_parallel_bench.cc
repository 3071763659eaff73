// tensor_parallel_bench: Megatron-style tensor parallelism of the decoder (model/tensor_parallel.h:
// each MLP's gate_proj/up_proj column parallel and down_proj row parallel; by default each
// attention split by heads too, q_proj/k_proj/v_proj keeping the rank's query and key/value heads
// and o_proj their columns; `parallelism.tensor_parallel_mlp_only: true` keeps attention whole),
// alone and beside DeepSpeed-Ulysses sequence parallelism, on CPU ranks.
//
// Two tables. First, tiny (configs/models/tiny: hidden 64, 4 heads / 2 key/value heads, MLP 0.5%
// of the weights) for the meshes (tp, sp) = (1,1), (2,1), (1,2), (2,2) with attention split and
// (4,1) with tensor_parallel_mlp_only (4 does not divide tiny's 2 key/value heads), world tp x sp,
// one data-parallel group, and prompts of about --lengths tokens. Second, an MLP-heavy model the
// bench writes into --work/mlp-model (tiny's config with hidden 256, intermediate 8192, 4 layers,
// 4 heads / 4 key/value heads (so that tp 4 splits attention too), mrope_section [8,12,12] for
// head_dim 64, vision_config.hidden_size 256 (Qwen2-VL's merger output, which must equal the text
// hidden size); no weights, so it is built from the seed) for (1,1), (2,1), (4,1), attention
// split, at --mlp_lengths. Each run is real `trainctl-trainer train` ranks of SFT (eager
// attention, fp32, ZeRO stage 0, batch 1, no gradient checkpointing); the bench prints for rank
// 0: whether the attention is split ("attn": split, whole, or - at tp 1), the step time, the peak
// memory above the model states (the `memory` event's peak_bytes less its master, optimizer and
// gradient bytes) and its ratio to (1,1) at the same length, master_bytes against its model
// (every weight's fp32 bytes from the config, the split weights counted 1/tp: stage 0 pads
// nothing), the split weights' fp32 bytes per rank ("split MiB": layers x (3 x H x intermediate
// + A) x 4 / tp, A = 2 x H x H + H + 2 x (K x H + K) the attention's q/k/v/o weights and biases
// when attention is split, else 0, with H and K as below; at tp 1 what tp would split, attention
// included), and the bytes each group sent per step against the communication models (the tensor
// group's model also split into its f/g all-reduces and its replicated gradients' all-reduces),
// which read layers, hidden size and heads from the run's config (Comm counts an all-reduce as
// 2 x RingBytes = 2 x floor(bytes x (T - 1) / T) per rank, the reduce-scatter and all-gather
// halves of a ring; an all-to-all as RingBytes of its input):
//
//   tensor group (T = tp): per decoder layer and micro-batch, 4 all-reduces of [B, L, hidden] fp32
//   with attention split (the MLP's and the attention's: g's forward sum of the block's output,
//   f's backward sum of its input's gradient; more in backward with gradient checkpointing, off
//   here), 2 (the MLP's) with mlp_only; L = ceil(S / sp) the rank's slice of the row; plus, per
//   step, the all-reduce of the sliced weights' squared gradient norm (1 fp64); plus, per step
//   and engine unit, one all-reduce of the unit's replicated weights' gradients
//   (Engine::AverageReplicatedGradients: every weight but the split ones, no vocab_parallel here;
//   fp32, whole at ZeRO stage 0, so each is a unit's replicated count x 4 bytes, floored per
//   unit). The units (Units()) and their replicated counts, from the config (E = vision
//   embed_dim, M = E x mlp_ratio, P = in_chans x temporal_patch_size x patch_size^2, D = E x
//   spatial_merge_size^2, O = vision hidden_size, H = hidden, K = kv heads x head_dim):
//     model.embed_tokens  vocab x H
//     visual.patch_embed  E x P (Conv3d, no bias)
//     visual.blocks.N     norm1, norm2 (LayerNorm, 2E each), attn.qkv 3E x E + 3E,
//                         attn.proj E x E + E, mlp.fc1 M x E + M, mlp.fc2 E x M + E
//     visual.merger       ln_q 2E, mlp.0 D x D + D, mlp.2 O x D + O
//     model.layers.N      input_layernorm and post_attention_layernorm H each; with mlp_only
//                         also q_proj H x H + H, k_proj and v_proj K x H + K each, o_proj H x H
//                         (with attention split these are the rank's slices, not averaged)
//     head                model.norm H (tied: the embedding is borrowed), plus lm_head vocab x H
//                         when not tied
//   sequence group: the model of sequence_parallel_bench (all-to-alls of q, k, v and the attention
//   output per layer forward and again in backward, (sp - 1) / sp of each slice; the last hidden
//   states gathered whole, forward and backward; fp32), with attention split of the rank's heads
//   only: q and the output hidden / tp wide, k and v (kv heads / tp) x head_dim, or hidden / tp
//   when kv heads / tp does not divide by sp and UlyssesAttention repeats them to the rank's query
//   heads (tiny at (2,2): 1 key/value head per rank, sp 2) (mesh_bench.h SequenceModelBytes).
//
// The MLP model's master bytes per rank should fall by its split weights x (1 - 1/tp) (4 layers,
// each of 3 x 256 x 8192 MLP and 262,912 attention weights: 96 + 4.0 MiB fp32); its activation
// peak a little (the MLP's intermediates and the attention's per-head tensors are 1/tp), but on
// CPU the peak is a resident-set high-water mark and follows this loosely (bench/README.md).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
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
  config["num_key_value_heads"] = 4;                      // tp 4 splits attention too
  config["rope_scaling"]["mrope_section"] = {8, 12, 12};  // sums to head_dim / 2 = 32
  config["vision_config"]["hidden_size"] = 256;           // the merger's output: text hidden_size
  const std::string dir = absl::StrCat(work, "/mlp-model");
  fs::create_directories(dir);
  std::ofstream(absl::StrCat(dir, "/config.json")) << config.dump(2) << "\n";
  return dir;
}

// One run's mesh: tp x sp ranks; mlp_only sets parallelism.tensor_parallel_mlp_only.
struct TpMesh {
  int tp = 1, sp = 1;
  bool mlp_only = false;
  // Whether the decoder's attention is split over the tensor group (TensorParallelSplitsAttention).
  bool attention_split() const { return tp > 1 && !mlp_only; }
  const char* attention() const { return tp == 1 ? "-" : mlp_only ? "whole" : "split"; }
};

// Runs the tp x sp ranks of one run and reads rank 0's events.
bench::RankEvents RunTp(const std::string& work, const std::string& tag, const std::string& model,
                        const std::string& shards, int words, const TpMesh& mesh, int steps) {
  bench::MeshRun run;
  run.name =
      absl::StrCat(tag, "-tp", mesh.tp, "sp", mesh.sp, mesh.mlp_only ? "mlp" : "", "-", words);
  run.model = model;
  run.shards = shards;
  run.parallelism = {{"tensor_parallel_size", mesh.tp}, {"sequence_parallel_size", mesh.sp}};
  if (mesh.mlp_only) run.parallelism["tensor_parallel_mlp_only"] = true;
  run.world = mesh.tp * mesh.sp;
  run.words = words;
  run.steps = steps;
  run.port_base = 29811;
  return bench::RunSftRanks(work, run);
}

// Comm's count for one all-reduce of `bytes` over `world` ranks (comm.cc: 2 x RingBytes).
int64_t TpAllReduceBytes(int64_t bytes, int world) { return 2 * (bytes * (world - 1) / world); }

// A decoder layer's attention weights (q/k/v/o_proj, weights and biases), whole.
int64_t AttentionNumel(const json& config) {
  const int64_t hidden = config["hidden_size"].get<int64_t>();
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const int64_t kv = config["num_key_value_heads"].get<int64_t>() * (hidden / heads);
  return (hidden * hidden + hidden) + 2 * (kv * hidden + kv) + hidden * hidden;
}

// A decoder layer's split weights, whole: the MLP's gate/up/down_proj, plus its attention's when
// `attention_split`.
int64_t SplitLayerNumel(const json& config, bool attention_split) {
  const int64_t mlp =
      3 * config["hidden_size"].get<int64_t>() * config["intermediate_size"].get<int64_t>();
  return mlp + (attention_split ? AttentionNumel(config) : 0);
}

// Each engine unit's replicated parameter count (the header's list), in Units() order, for
// `config` without vocab_parallel; with `attention_split` the decoder layers' q/k/v/o_proj are
// split (not replicated).
std::vector<int64_t> ReplicatedUnitNumels(const json& config, bool attention_split) {
  const int64_t hidden = config["hidden_size"].get<int64_t>();
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
  const int64_t layer = 2 * hidden + (attention_split ? 0 : AttentionNumel(config));
  for (int64_t i = 0; i < config["num_hidden_layers"].get<int64_t>(); ++i) units.push_back(layer);
  const bool tied = config.value("tie_word_embeddings", false);
  units.push_back(hidden + (tied ? 0 : vocab * hidden));
  return units;
}

// The master weights' model: every weight's fp32 bytes on a rank of `mesh`, the split ones 1/tp.
double MasterModelBytes(const json& config, const TpMesh& mesh) {
  int64_t numel = 0;
  for (int64_t n : ReplicatedUnitNumels(config, /*attention_split=*/false)) numel += n;
  const int64_t layers = config["num_hidden_layers"].get<int64_t>();
  numel += layers * SplitLayerNumel(config, false);  // the whole model
  const int64_t split = layers * SplitLayerNumel(config, mesh.attention_split());
  numel += split / mesh.tp - split;
  return 4.0 * static_cast<double>(numel);
}

// The tensor group's model above, per rank and step, for one row of `tokens` (padded to sp),
// split into the f/g all-reduces, the norm's and the replicated gradients'.
struct TensorModel {
  int64_t activations = 0, norm = 0, replicated = 0;
  double total() const { return static_cast<double>(activations + norm + replicated); }
};

TensorModel TensorModelBytes(const bench::ModelSizes& m, const json& config, const TpMesh& mesh,
                             int64_t tokens) {
  TensorModel out;
  const int tp = mesh.tp;
  if (tp == 1) return out;
  const int64_t slice = (tokens + mesh.sp - 1) / mesh.sp;
  const int64_t per_layer = mesh.attention_split() ? 4 : 2;
  out.activations = m.layers * per_layer * TpAllReduceBytes(4 * slice * m.hidden, tp);
  out.norm = TpAllReduceBytes(8, tp);
  for (int64_t numel : ReplicatedUnitNumels(config, mesh.attention_split()))
    out.replicated += TpAllReduceBytes(4 * numel, tp);
  return out;
}

double TpRatio(double sent, double model) { return model > 0 ? sent / model : 0; }

void PrintTpHeader(const std::string& tag, const bench::ModelSizes& shape) {
  absl::PrintF(
      "tensor_parallel_bench: %s (hidden %d, intermediate %d, %d layers, %d key/value heads), CPU "
      "ranks, fp32, eager attention, batch 1\n",
      tag, shape.hidden, shape.intermediate, shape.layers, shape.kv_heads);
  absl::PrintF(
      "%6s %2s %2s %5s %8s %11s %6s %10s %10s %6s %9s %12s %12s %6s %12s %12s %12s %12s %6s\n",
      "words", "tp", "sp", "attn", "step s", "peak-st MiB", "vs 1x1", "master MiB", "model MiB",
      "ratio", "split MiB", "tp B/step", "tp model", "ratio", "of it: f/g", "replicated",
      "sp B/step", "sp model", "ratio");
}

// One row of a table: rank 0's events `r` of the run of `mesh` at `words`, against the models.
void PrintTpRow(const json& config, const bench::ModelSizes& shape, int words, const TpMesh& mesh,
                const bench::RankEvents& r, double base) {
  const int64_t tokens_per_row = static_cast<int64_t>(r.row_tokens + 0.5);
  const TensorModel tp_parts = TensorModelBytes(shape, config, mesh, tokens_per_row);
  const double tp_model = tp_parts.total();
  const double sp_model = bench::SequenceModelBytes(shape, mesh.sp, tokens_per_row,
                                                    mesh.attention_split() ? mesh.tp : 1);
  const double master_model = MasterModelBytes(config, mesh);
  // At tp 1: what tp would split (the attention too unless mlp_only).
  const double split_mib = 4.0 * static_cast<double>(shape.layers) *
                           SplitLayerNumel(config, !mesh.mlp_only) / mesh.tp / (1 << 20);
  absl::PrintF(
      "%6d %2d %2d %5s %8.3f %11.1f %6.3f %10.3f %10.3f %6.3f %9.3f %12.0f %12.0f %6.3f %12d %12d "
      "%12.0f %12.0f %6.3f\n",
      words, mesh.tp, mesh.sp, mesh.attention(), r.step_seconds, r.peak_above_states / (1 << 20),
      base > 0 ? r.peak_above_states / base : 0, r.master_bytes / (1 << 20),
      master_model / (1 << 20), TpRatio(r.master_bytes, master_model), split_mib,
      r.tensor_bytes_per_step, tp_model, TpRatio(r.tensor_bytes_per_step, tp_model),
      tp_parts.activations, tp_parts.replicated, r.sequence_bytes_per_step, sp_model,
      TpRatio(r.sequence_bytes_per_step, sp_model));
}

// One table: every mesh at every length of `lengths`, for the model `model` (a registry name or
// a folder with a config.json) whose config is `config`.
void RunTpTable(const std::string& work, const std::string& tag, const std::string& model,
                const json& config, const std::string& lengths, const std::vector<TpMesh>& meshes) {
  if (lengths.empty()) return;
  const bench::ModelSizes shape = TpShapeOf(config);
  const int steps = absl::GetFlag(FLAGS_steps);
  PrintTpHeader(tag, shape);
  for (absl::string_view text : absl::StrSplit(lengths, ',')) {
    int words = 0;
    if (!absl::SimpleAtoi(text, &words)) continue;
    const std::string shards = bench::PrepareLongPrompts(work, words);
    double base = 0;
    for (const TpMesh& mesh : meshes) {
      const bench::RankEvents r = RunTp(work, tag, model, shards, words, mesh, steps);
      if (mesh.tp == 1 && mesh.sp == 1) base = r.peak_above_states;
      PrintTpRow(config, shape, words, mesh, r, base);
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
  // tp 4 does not divide tiny's 2 key/value heads: its attention stays whole.
  RunTpTable(work, "tiny", "tiny", tiny, absl::GetFlag(FLAGS_lengths),
             {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1, /*mlp_only=*/true}});
  const std::string mlp_dir = WriteMlpModel(work);
  RunTpTable(work, "mlp", mlp_dir, ReadTpConfig(absl::StrCat(mlp_dir, "/config.json")),
             absl::GetFlag(FLAGS_mlp_lengths), {{1, 1}, {2, 1}, {4, 1}});
  return 0;
}
