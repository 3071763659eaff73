// gpu_train_bench: bf16 training throughput and model-FLOPs utilisation of a ~1.1B-parameter
// Qwen2-VL config on one GPU, and its peak memory against the ZeRO memory model.
//
// Two ways to train the same model on the same batches, measured in the same run:
//   engine: what trainctl-trainer runs: the ZeRO engine at --stage (3 by default) with bf16
//           working weights gathered per unit, fp32 master weights, gradients and AdamW state,
//           and the head fused with the loss (--fused_loss);
//   plain:  the peer, what a LibTorch user writes: fp32 parameters, bf16 autocast, torch AdamW;
//   plain_recompute: the same with each decoder layer recomputed in backward (activation
//           checkpointing): the peer of the engine run with --checkpointing;
//   engine_unfused: the engine with the decoder's RMSNorm, rotary and SwiGLU as LibTorch's
//           composite ops instead of the fused CUDA kernels (model/fused_ops.h): what they gain.
// The other modes run the fused kernels where the build has them (--fused_kernels=false: none).
// and two ceilings: a bf16 GEMM measured in the same run (8192^3 and the model's own shapes) and
// the H100/H200 datasheet's dense bf16 peak (--peak_tflops, 989.4).
//
// Model FLOPs per step (PaLM appendix B, no causal halving, as bench/sft_bench.cc):
//   6 * N * tokens + 12 * L * H * T^2 * B, N = decoder matmul parameters + the (tied) head.
//
// Memory (ZeRO paper, mixed-precision AdamW): model states of 16 bytes per parameter at stage 3 on
// one rank (fp32 master 4 + AdamW moments 8 + fp32 gradient 4), plus the gathered bf16 working
// weights, plus activations. The engine's own accounting and the CUDA allocator's peak are printed
// beside that model.
//
// Runs on CPU too (--device cpu) with a small --preset, which is how CPU CI compiles and smoke-runs
// it; the figures that matter come from a CUDA build on a GPU (scripts/gpu-check.sh).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/fused_ops.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/stages/internal/autocast.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

#ifdef TRAINCTL_CUDA_BUILD
#include <c10/cuda/CUDACachingAllocator.h>
#endif

ABSL_FLAG(std::string, device, "cuda", "cuda or cpu");
ABSL_FLAG(std::string, preset, "1b", "1b (~1.1B parameters) or small (~30M, for CPUs)");
ABSL_FLAG(int, batch, 8, "sequences per step");
ABSL_FLAG(int, seq, 2048, "tokens per sequence");
ABSL_FLAG(int, warmup, 2, "unmeasured steps per mode");
ABSL_FLAG(int, steps, 5, "measured steps per mode");
ABSL_FLAG(int, stage, 3, "ZeRO stage of the engine mode");
ABSL_FLAG(std::string, modes, "engine,engine_unfused,plain,plain_recompute",
          "which of engine, engine_unfused, plain and plain_recompute to run");
ABSL_FLAG(std::string, attention, "auto", "auto, eager or sdpa");
ABSL_FLAG(bool, checkpointing, false, "recompute decoder layers in backward");
ABSL_FLAG(bool, fused_loss, true,
          "engine mode: the head fused with the loss in chunks, as the SFT stage runs it");
ABSL_FLAG(bool, fused_kernels, true,
          "the fused RMSNorm, rotary and SwiGLU kernels in every mode but engine_unfused");
ABSL_FLAG(double, peak_tflops, 989.4, "datasheet dense bf16 TFLOP/s of the GPU (H100/H200 SXM)");
ABSL_FLAG(std::string, json, "", "also write the figures to this JSON file");

namespace {

using Clock = std::chrono::steady_clock;
namespace model = trainctl::model;
namespace zero = trainctl::zero;

// --preset 1b is configs/models/bench-1b (~1.1B: hidden 2048, 18 layers, 16 heads of 128 with 4 kv
// heads, MLP 5504, Qwen's vocabulary 151936, tied embeddings; a minimal vision tower, as the
// batches are text), the model scripts/gpu/hf_peers.py builds in transformers for the peers.
constexpr char kSmall[] = R"({
  "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
  "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6,
  "num_attention_heads": 8, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vision_config": {"depth": 1, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2, "in_chans": 3,
    "hidden_size": 512, "hidden_act": "quick_gelu", "patch_size": 14, "spatial_merge_size": 2,
    "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]}, "vocab_size": 32000
})";

void Sync(const torch::Device& device) {
#ifdef TRAINCTL_CUDA_BUILD
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int64_t PeakDeviceBytes(const torch::Device& device) {
#ifdef TRAINCTL_CUDA_BUILD
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#endif
  (void)device;
  return 0;
}

void ResetPeak(const torch::Device& device) {
#ifdef TRAINCTL_CUDA_BUILD
  if (device.is_cuda()) {
    Sync(device);
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#endif
  (void)device;
}

struct Gemm {
  std::string name;
  int64_t m, k, n;
};

// FLOP/s of bf16 [m, k] x [k, n] (float32 on CPU), best of 3 timed batches of ~0.2 s.
double GemmFlops(const Gemm& g, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const auto dtype = device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  const torch::Tensor a = torch::randn({g.m, g.k}, opts), b = torch::randn({g.k, g.n}, opts);
  torch::Tensor c = torch::matmul(a, b);
  Sync(device);
  auto start = Clock::now();
  c = torch::matmul(a, b);
  Sync(device);
  const int calls = std::max(1, static_cast<int>(0.2 / std::max(Seconds(start), 1e-7)));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    start = Clock::now();
    for (int i = 0; i < calls; ++i) c = torch::matmul(a, b);
    Sync(device);
    best = std::max(best, 2.0 * g.m * g.k * g.n * calls / Seconds(start));
  }
  return best;
}

struct ModeResult {
  std::string mode;
  double median_s = 0, min_s = 0, max_s = 0;
  double last_loss = 0;
  int64_t peak_bytes = 0;
  zero::MemoryStats memory;
  bool has_memory = false;
};

// The mean next-token cross-entropy. `fused`: the head fused with the loss, a chunk of rows at a
// time (HeadCrossEntropy, what the SFT stage runs); otherwise the [tokens, vocab] logits in full,
// upcast to fp32, as a LibTorch user writes it.
torch::Tensor LossOf(model::Qwen2VLForConditionalGeneration& net, const torch::Tensor& ids,
                     const torch::Device& device, bool fused) {
  model::ModelInputs in;
  in.input_ids = ids;
  const int64_t t = ids.size(1);
  trainctl::trainer::internal::AutocastGuard autocast(true, device.type(), torch::kBFloat16);
  const torch::Tensor hidden = net.ForwardHidden(in);
  const torch::Tensor rows = hidden.slice(1, 0, t - 1).reshape({-1, hidden.size(-1)});
  const torch::Tensor labels = ids.slice(1, 1, t).reshape({-1});
  if (fused) return net.HeadCrossEntropy(rows, labels) / labels.size(0);
  return torch::nn::functional::cross_entropy(net.Head(rows).to(torch::kFloat32), labels);
}

// The flags of a run, read and checked once; `config` is the --preset's model.
struct RunOptions {
  torch::Device device{torch::kCPU};
  int64_t B = 0, T = 0;
  int warmup = 0, steps = 0;
  model::AttentionImpl attention{};
  model::Qwen2VLConfig config;
  bool fused_loss = true, fused_kernels = true;
};

// Parses the flags, picks and initialises the device and loads the preset's config; false (with
// the reason on stderr) when one of them is unusable.
bool ParseRunOptions(int argc, char** argv, RunOptions* run) {
  absl::ParseCommandLine(argc, argv);
  torch::Device device(absl::GetFlag(FLAGS_device));
  if (device.is_cuda() && !device.has_index()) device = torch::Device(torch::kCUDA, 0);
  if (device.is_cuda() && torch::cuda::is_available()) {
    torch::zeros({1}, torch::TensorOptions().device(device));  // initialises the allocator
  }
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "gpu_train_bench: --device cuda but this build or machine has no CUDA\n";
    return false;
  }
  const int64_t B = absl::GetFlag(FLAGS_batch), T = absl::GetFlag(FLAGS_seq);
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = std::max(1, absl::GetFlag(FLAGS_steps));
  auto attention = model::ParseAttentionImpl(absl::GetFlag(FLAGS_attention));
  absl::StatusOr<model::Qwen2VLConfig> config =
      model::ParseQwen2VLConfig(kSmall, "gpu_train_bench");
  if (absl::GetFlag(FLAGS_preset) == "1b") {
    auto path = model::FindModelConfig("bench-1b");
    config = path.ok() ? model::LoadQwen2VLConfig(*path)
                       : absl::StatusOr<model::Qwen2VLConfig>(path.status());
  }
  if (!config.ok() || !attention.ok()) {
    std::cerr << "gpu_train_bench: " << (config.ok() ? attention.status() : config.status())
              << "\n";
    return false;
  }
  if (device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setAllowTF32CuDNN(true);
  }
  run->device = device;
  run->B = B;
  run->T = T;
  run->warmup = warmup;
  run->steps = steps;
  run->attention = *attention;
  run->config = *config;
  run->fused_loss = absl::GetFlag(FLAGS_fused_loss);
  run->fused_kernels = absl::GetFlag(FLAGS_fused_kernels);
  return true;
}

// One mode's model and what trains it: the ZeRO engine (with its comm) or the plain module with
// torch AdamW. Members in dependency order: the engine uses the comm.
struct ModeModel {
  std::unique_ptr<zero::Comm> comm;
  std::unique_ptr<zero::Engine> engine;
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> plain;
  std::unique_ptr<torch::optim::AdamW> adam;
  model::Qwen2VLForConditionalGeneration* net = nullptr;
};

// `mode`'s model in training mode, with the run's attention and checkpointing.
absl::StatusOr<ModeModel> BuildMode(const std::string& mode, const RunOptions& run) {
  const torch::Device& device = run.device;
  const model::Qwen2VLConfig& config = run.config;
  const int64_t H = config.hidden_size;
  ModeModel m;
  if (mode == "engine" || mode == "engine_unfused") {
    zero::CommOptions comm_options;
    comm_options.device = device;
    m.comm = std::move(zero::Comm::Create(comm_options).value());
    zero::EngineOptions options;
    options.stage = absl::GetFlag(FLAGS_stage);
    options.compute_dtype = torch::kBFloat16;
    options.device = device;
    options.lr = 1e-4;
    options.overlap_comm = true;
    options.param_persistence_threshold = 10 * H;
    options.prefetch_bucket_size = static_cast<int64_t>(0.9 * H * H);
    auto created = zero::Engine::Create(config, options, m.comm.get(), /*seed=*/0);
    if (!created.ok()) return created.status();
    m.engine = std::move(*created);
    m.net = &m.engine->model();
  } else {
    m.plain = std::make_shared<model::Qwen2VLForConditionalGeneration>(config);
    m.plain->to(device);
    m.adam = std::make_unique<torch::optim::AdamW>(m.plain->parameters(),
                                                   torch::optim::AdamWOptions(1e-4));
    m.net = m.plain.get();
  }
  m.net->train();
  m.net->SetAttentionImpl(run.attention);
  model::GradientCheckpointing ckpt;
  ckpt.decoder_layers = absl::GetFlag(FLAGS_checkpointing) || mode == "plain_recompute";
  m.net->SetGradientCheckpointing(ckpt);
  return m;
}

// --warmup unmeasured then --steps timed training steps of `m` on the same random batches in
// every mode: median, min and max seconds, the last loss, peak device memory (and the engine's
// own accounting).
ModeResult MeasureMode(const std::string& mode, const RunOptions& run, ModeModel* m) {
  const torch::Device& device = run.device;
  const int64_t B = run.B, T = run.T, V = run.config.vocab_size;
  const int warmup = run.warmup, steps = run.steps;
  const bool fused_loss = run.fused_loss;
  auto step = [&](const torch::Tensor& ids) {
    torch::Tensor loss = LossOf(*m->net, ids, device, m->engine != nullptr && fused_loss);
    if (m->engine) {
      if (!m->engine->Backward(loss).ok() || !m->engine->Step(1e-4).ok()) std::abort();
    } else {
      m->adam->zero_grad();
      loss.backward();
      m->adam->step();
    }
    return loss.item<double>();
  };
  torch::manual_seed(1);
  std::vector<torch::Tensor> batches;
  for (int i = 0; i < warmup + steps; ++i) {
    batches.push_back(
        torch::randint(0, V, {B, T}, torch::TensorOptions().dtype(torch::kLong)).to(device));
  }
  ModeResult r;
  r.mode = mode;
  for (int i = 0; i < warmup; ++i) step(batches[i]);
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    Sync(device);
    const auto start = Clock::now();
    r.last_loss = step(batches[warmup + i]);
    Sync(device);
    times.push_back(Seconds(start));
  }
  std::sort(times.begin(), times.end());
  r.median_s = times[times.size() / 2];
  r.min_s = times.front();
  r.max_s = times.back();
  r.peak_bytes = PeakDeviceBytes(device);
  if (m->engine) {
    r.memory = m->engine->Memory();
    r.has_memory = true;
  }
  return r;
}

// Every mode --modes names, in the fixed order, each on a fresh model from seed 0. Sets
// `total_params` from the first mode's model.
absl::StatusOr<std::vector<ModeResult>> MeasureModes(const RunOptions& run, int64_t* total_params) {
  const torch::Device& device = run.device;
  std::vector<ModeResult> results;
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  const bool fused_kernels = run.fused_kernels;
  for (const std::string mode : {"engine", "engine_unfused", "plain", "plain_recompute"}) {
    if (std::find(modes.begin(), modes.end(), mode) == modes.end()) continue;
    model::SetFusedKernelsEnabled(fused_kernels && mode != "engine_unfused");
    ResetPeak(device);
    torch::manual_seed(0);
    absl::StatusOr<ModeModel> built = BuildMode(mode, run);
    if (!built.ok()) return built.status();
    if (*total_params == 0) {
      if (built->engine) {
        *total_params = built->engine->Memory().parameters;
      } else {
        for (const auto& p : built->net->parameters()) *total_params += p.numel();
      }
    }
    results.push_back(MeasureMode(mode, run, &*built));
  }
  return results;
}

// The ceilings: the model line, the batch line and the GEMM table (bf16 on CUDA), measured now.
// Returns the best GEMM FLOP/s; `gemms` gets each shape's TFLOP/s.
double PrintModelAndGemms(const RunOptions& run, int64_t total_params, int64_t N,
                          double flop_per_step, nlohmann::json* gemms) {
  const torch::Device& device = run.device;
  const model::Qwen2VLConfig& config = run.config;
  const int64_t B = run.B, T = run.T;
  const int64_t H = config.hidden_size, L = config.num_hidden_layers, V = config.vocab_size;
  const int64_t I = config.intermediate_size;
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  const int64_t tokens = B * T;
  const std::vector<Gemm> shapes = {
      {"8192x8192x8192", 8192, 8192, 8192},    {"[BT,H]x[H,I] MLP up", tokens, H, I},
      {"[BT,I]x[I,H] MLP down", tokens, I, H}, {"[BT,H]x[H,H] q/o", tokens, H, H},
      {"[BT,H]x[H,kv] k/v", tokens, H, kv},    {"[BT,H]x[H,V] head", tokens, H, V},
  };
  double gemm_peak = 0;
  std::cout << absl::StrFormat(
      "model: hidden %d, %d layers, %d heads (%d kv), MLP %d, vocab %d, tied; %.3fB parameters "
      "(N = %.3fB without the vision stub)\n",
      H, L, config.num_attention_heads, config.num_key_value_heads, I, V, total_params / 1e9,
      N / 1e9);
  std::cout << absl::StrFormat("batch %d x %d = %d tokens/step, %.1f TFLOP/step, device %s\n\n", B,
                               T, tokens, flop_per_step / 1e12, device.str());
  std::cout << absl::StrFormat("%-28s %12s\n", "GEMM (bf16 on CUDA)", "TFLOP/s");
  for (const auto& g : shapes) {
    const double f = GemmFlops(g, device);
    gemm_peak = std::max(gemm_peak, f);
    (*gemms)[g.name] = f / 1e12;
    std::cout << absl::StrFormat("%-28s %12.1f\n", g.name, f / 1e12);
  }
  return gemm_peak;
}

// The engine's memory against the ZeRO model: printed under its mode's row and added to `m`.
void ReportEngineMemory(const ModeResult& r, nlohmann::json* m) {
  const double psi = static_cast<double>(r.memory.parameters);
  const int64_t states = r.memory.master_bytes + r.memory.optimizer_bytes + r.memory.gradient_bytes;
  (*m)["model_states_bytes"] = states;
  (*m)["zero_model_states_bytes"] = 16 * psi;
  (*m)["peak_working_bytes"] = r.memory.peak_working_bytes;
  (*m)["activations_and_temporaries_bytes"] = r.peak_bytes - states - r.memory.peak_working_bytes;
  std::cout << absl::StrFormat(
      "  engine memory: model states %.2f GiB (ZeRO model 16 bytes x %.3fB = %.2f GiB; master "
      "%.2f + AdamW %.2f + gradients %.2f), working bf16 weights peak %.2f GiB, activations "
      "and temporaries %.2f GiB (peak allocated - the two)\n",
      states / double(1 << 30), psi / 1e9, 16 * psi / double(1 << 30),
      r.memory.master_bytes / double(1 << 30), r.memory.optimizer_bytes / double(1 << 30),
      r.memory.gradient_bytes / double(1 << 30), r.memory.peak_working_bytes / double(1 << 30),
      (r.peak_bytes - states - r.memory.peak_working_bytes) / double(1 << 30));
}

// The modes table (MFU against the datasheet and against the measured GEMM peak) and the engine's
// step time over each peer's, each also into `out`.
void PrintModes(const std::vector<ModeResult>& results, int64_t tokens, double flop_per_step,
                double datasheet, double gemm_peak, nlohmann::json* out) {
  std::cout << absl::StrFormat("\n%-15s %9s %11s %9s %13s %13s %11s\n", "mode", "s/step",
                               "tokens/s", "TFLOP/s", "MFU datasheet", "MFU vs GEMM", "peak GiB");
  for (const auto& r : results) {
    const double achieved = flop_per_step / r.median_s;
    std::cout << absl::StrFormat("%-15s %9.3f %11.0f %9.1f %12.1f%% %12.1f%% %11.2f\n", r.mode,
                                 r.median_s, tokens / r.median_s, achieved / 1e12,
                                 100 * achieved / datasheet, 100 * achieved / gemm_peak,
                                 r.peak_bytes / double(1 << 30));
    nlohmann::json m = {{"s_per_step", r.median_s},
                        {"s_min", r.min_s},
                        {"s_max", r.max_s},
                        {"tokens_per_s", tokens / r.median_s},
                        {"tflops", achieved / 1e12},
                        {"mfu_datasheet", achieved / datasheet},
                        {"mfu_vs_gemm", achieved / gemm_peak},
                        {"peak_bytes", r.peak_bytes},
                        {"last_loss", r.last_loss}};
    if (r.has_memory) ReportEngineMemory(r, &m);
    (*out)[r.mode] = m;
  }
  // plain keeps every activation, as the engine does without --checkpointing; plain_recompute is
  // the peer of a run with it.
  for (const auto& peer : results) {
    if (results[0].mode != "engine" || peer.mode == "engine") continue;
    const double ratio = results[0].median_s / peer.median_s;
    std::cout << absl::StrFormat("engine / %s step time: %.3f\n", peer.mode, ratio);
    (*out)["engine_over_" + peer.mode] = ratio;
  }
}

}  // namespace

int main(int argc, char** argv) {
  RunOptions run;
  if (!ParseRunOptions(argc, argv, &run)) return 1;
  const int64_t B = run.B, T = run.T;
  const int64_t H = run.config.hidden_size, L = run.config.num_hidden_layers;
  const int64_t tokens = B * T;

  int64_t total_params = 0;
  absl::StatusOr<std::vector<ModeResult>> measured = MeasureModes(run, &total_params);
  if (!measured.ok()) {
    std::cerr << "gpu_train_bench: " << measured.status() << "\n";
    return 1;
  }
  const std::vector<ModeResult>& results = *measured;
  if (results.empty()) {
    std::cerr << "gpu_train_bench: --modes names none of engine, engine_unfused, plain, "
                 "plain_recompute\n";
    return 1;
  }

  // N: the decoder layers, the final norm and the embedding matrix, counted once as the tied head
  // (a matmul; the lookup is not). The unused vision stub is left out.
  int64_t vision = 0;
  for (const auto& p : model::Qwen2VisionTransformer(run.config.vision).parameters()) {
    vision += p.numel();
  }
  const int64_t N = total_params - vision;  // decoder layers + norm + embedding(= tied head)
  const double flop_per_step = 6.0 * N * tokens + 12.0 * L * H * static_cast<double>(T) * T * B;

  nlohmann::json gemms = nlohmann::json::object();
  const double gemm_peak = PrintModelAndGemms(run, total_params, N, flop_per_step, &gemms);
  const double datasheet = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  nlohmann::json out = {
      {"parameters", total_params},
      {"flop_per_step", flop_per_step},
      {"tokens_per_step", tokens},
      {"gemm_tflops", gemms},
      {"gemm_peak_tflops", gemm_peak / 1e12},
      {"datasheet_tflops", datasheet / 1e12},
      {"fused_kernels", {{"built", model::FusedKernelsBuilt()}, {"enabled", run.fused_kernels}}}};
  PrintModes(results, tokens, flop_per_step, datasheet, gemm_peak, &out);
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return 0;
}
