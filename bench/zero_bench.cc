// zero_bench: what ZeRO-3 costs and saves, measured against its peers in the same run. Each
// configuration runs as real ranks: forked processes that rendezvous on loopback and train over
// Gloo through the engine, one thread each (LibTorch's and OpenBLAS's), fp32, on random text-only
// batches, with the trainer's host runtime (model/host_runtime.h) except in the memory mode.
//
// Step time (--mode=step, a ~25M-parameter config with untied embeddings):
//   stage 3 on 2 ranks vs stage 0 on 2 ranks vs 1 rank, on the same global batch; and the bytes
//   each rank sent per step at stage 3 against the theoretical 3·P (two all-gathers of the
//   weights and one reduce-scatter of the gradients, each (W-1)/W of P elements for a ring).
//   P counts the text model (the batches have no images, so the vision tower never runs).
//   And stage 3 on 1 rank against stage 0 on 1 rank, same batch: what stage 3 itself costs when
//   there is no communication to hide behind (its gathers and reduces are local copies).
// One rank (--mode=one_rank): that last pair only, --rounds times in alternation, each round's
//   ratio and their median (aim: <= 1.05), since one pair swings by 10% on a noisy VM.
// Memory (--mode=memory, a ~150M-parameter config): peak resident memory (VmHWM) of each rank
//   after two steps at stage 0 and at stage 3, on 2 and on 4 ranks; the ratio stage 3 / stage 0
//   (aim: <= 0.6 on 2 ranks, <= 0.35 on 4).
// Loss (--mode=loss): the head's cross-entropy over 4 x --seq tokens of Qwen's vocabulary,
//   unfused against fused in chunks (HeadCrossEntropy): peak resident memory and time.
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/process_stats.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/zero/comm.h"
#include "worker/trainer/zero/engine.h"

ABSL_FLAG(std::string, mode, "all", "step | one_rank | memory | loss | all (step and memory)");
ABSL_FLAG(int, rounds, 5, "one_rank mode: alternating stage 0 / stage 3 rounds");
ABSL_FLAG(int, steps, 5, "measured steps (step mode)");
ABSL_FLAG(int, seq, 128, "tokens per sequence");
ABSL_FLAG(std::string, worlds, "2,4", "world sizes of the memory mode");
ABSL_FLAG(int, mmap_threshold, 1 << 20,
          "memory mode: glibc M_MMAP_THRESHOLD in each rank (0: glibc's dynamic default); "
          "buffers above it are returned to the system when freed, so the peak counts live "
          "memory, not heap fragmentation. Step mode times ranks with the trainer's heap "
          "settings (model/host_runtime.h)");

namespace {

using trainctl::zero::Comm;
using trainctl::zero::CommOptions;
using trainctl::zero::Engine;
using trainctl::zero::EngineOptions;

constexpr char kConfigTemplate[] = R"({
  "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
  "hidden_act": "silu", "hidden_size": HIDDEN, "intermediate_size": INTER,
  "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "vision_config": {"depth": 1, "embed_dim": 32, "mlp_ratio": 2, "num_heads": 2, "in_chans": 3,
                    "hidden_size": HIDDEN, "hidden_act": "quick_gelu", "patch_size": 14,
                    "spatial_merge_size": 2, "temporal_patch_size": 2},
  "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
  "vocab_size": VOCAB, "image_token_id": 7, "vision_start_token_id": 8,
  "vision_end_token_id": 9, "video_token_id": 10
})";

trainctl::model::Qwen2VLConfig MakeConfig(int hidden, int layers, int inter, int vocab) {
  const std::string text =
      absl::StrReplaceAll(kConfigTemplate, {{"HIDDEN", std::to_string(hidden)},
                                            {"INTER", std::to_string(inter)},
                                            {"LAYERS", std::to_string(layers)},
                                            {"HEADS", std::to_string(hidden / 64)},
                                            {"KV", std::to_string(std::max(1, hidden / 128))},
                                            {"VOCAB", std::to_string(vocab)}});
  auto config = trainctl::model::ParseQwen2VLConfig(text, "zero_bench");
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    std::exit(1);
  }
  return *config;
}

struct Run {
  std::string name;
  int world;
  int stage;
  int batch;  // per rank
  int steps;  // measured, after one warm-up step
  // The trainer's heap (KeepTensorMemoryInTheHeap): step times are the product's. Else the fixed
  // --mmap_threshold, so that peak RSS counts live memory (memory mode).
  bool trainer_heap = false;
};

struct Report {
  double median_step_s = 0;
  double bytes_per_step = 0;
  double wait_per_step_s = 0;      // blocked in collectives' waits (not hidden by compute)
  double collectives_alone_s = 0;  // the step's collectives with nothing else running
  double text_params = 0;
  double peak_rss = 0;
};

// A stage-3 step's collectives with no compute beside them: every unit's weights all-gathered
// twice (forward, backward) and its gradients reduce-scattered once, unit by unit as the engine
// issues them (text units only), median of three rounds.
double CollectivesAlone(Comm& comm, Engine& e) {
  const int64_t world = comm.world_size();
  std::vector<double> rounds;
  for (int round = 0; round < 3; ++round) {
    comm.Barrier("collectives alone");
    const auto start = std::chrono::steady_clock::now();
    for (int pass = 0; pass < 3; ++pass) {
      for (const auto& unit : e.Layout()) {
        // The vision tower never runs on these text batches.
        if (unit["unit"].get<std::string>().rfind("visual.", 0) == 0) continue;
        const int64_t numel = unit["numel"].get<int64_t>();
        const int64_t shard = (numel + world - 1) / world;
        torch::Tensor full = torch::zeros({shard * world});
        torch::Tensor part = torch::zeros({shard});
        if (pass < 2) {
          comm.AllGather(part, full, "alone").Wait();
        } else {
          comm.ReduceScatter(full, part, "alone").Wait();
        }
      }
    }
    rounds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[1];
}

Report RankMain(const trainctl::model::Qwen2VLConfig& config, const Run& run, int rank, int port) {
  if (run.trainer_heap) {
    trainctl::model::KeepTensorMemoryInTheHeap();
  } else if (const int threshold = absl::GetFlag(FLAGS_mmap_threshold); threshold > 0) {
    mallopt(M_MMAP_THRESHOLD, threshold);
  }
  trainctl::model::SetCpuThreads(1);  // OpenBLAS too: ranks share the cores
  CommOptions co;
  co.rank = rank;
  co.world_size = run.world;
  co.master_port = port;
  co.timeout = std::chrono::seconds(600);
  auto comm = Comm::Create(co);
  if (!comm.ok()) throw std::runtime_error(std::string(comm.status().message()));
  EngineOptions eo;
  eo.stage = run.stage;
  eo.overlap_comm = true;
  eo.prefetch_bucket_size = config.hidden_size * config.hidden_size;
  eo.param_persistence_threshold = 10 * config.hidden_size;
  eo.lr = 1e-4;
  auto engine = Engine::Create(config, eo, comm->get(), /*seed=*/1);
  if (!engine.ok()) throw std::runtime_error(std::string(engine.status().message()));
  Engine& e = **engine;
  Report report;
  for (const auto& unit : e.Layout()) {
    if (unit["unit"].get<std::string>().rfind("visual.", 0) != 0) {
      report.text_params += unit["numel"].get<double>();
    }
  }
  const int seq = absl::GetFlag(FLAGS_seq);
  const double global_tokens = static_cast<double>(run.batch) * run.world * (seq - 1);
  std::vector<double> times;
  uint64_t bytes_before = 0;
  double wait_before = 0;
  for (int step = 0; step <= run.steps; ++step) {
    if (step == 1) {
      bytes_before = (*comm)->bytes_sent();
      wait_before = (*comm)->wait_seconds();
    }
    // Each rank draws its own slice of the same global batch.
    torch::manual_seed(1000 + step * 64 + rank);
    const torch::Tensor ids = torch::randint(11, config.vocab_size, {run.batch, seq});
    const auto start = std::chrono::steady_clock::now();
    trainctl::model::ModelInputs in;
    in.input_ids = ids;
    const torch::Tensor logits = e.model().forward(in);
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(
            logits.slice(1, 0, seq - 1).reshape({-1, config.vocab_size}),
            ids.slice(1, 1).reshape({-1}),
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
        global_tokens;
    if (!e.Backward(loss).ok() || !e.Step(1e-4).ok()) std::abort();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step > 0) times.push_back(s);
  }
  std::sort(times.begin(), times.end());
  report.median_step_s = times.empty() ? 0 : times[times.size() / 2];
  report.bytes_per_step =
      run.steps > 0 ? static_cast<double>((*comm)->bytes_sent() - bytes_before) / run.steps : 0;
  report.wait_per_step_s = run.steps > 0 ? ((*comm)->wait_seconds() - wait_before) / run.steps : 0;
  if (run.stage == 3 && run.world > 1) report.collectives_alone_s = CollectivesAlone(**comm, e);
  report.peak_rss = static_cast<double>(trainctl::PeakRssBytes());
  return report;
}

int FreePort() {
  static int next = 29700 + static_cast<int>(getpid() % 200) * 10;
  return next++;
}

// Forks one process per rank and collects each one's report through a pipe.
std::vector<Report> RunRanks(const trainctl::model::Qwen2VLConfig& config, const Run& run) {
  const int port = FreePort();
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 0; r < run.world; ++r) {
    int fd[2];
    if (pipe(fd) != 0) std::exit(1);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      Report report;
      try {
        report = RankMain(config, run, r, port);
      } catch (const std::exception& e) {
        std::cerr << run.name << " rank " << r << ": " << e.what() << "\n";
        _exit(1);
      }
      if (write(fd[1], &report, sizeof(report)) != sizeof(report)) _exit(1);
      _exit(0);
    }
    close(fd[1]);
    fds.push_back(fd[0]);
    pids.push_back(pid);
  }
  std::vector<Report> reports(run.world);
  bool ok = true;
  for (int r = 0; r < run.world; ++r) {
    ok = read(fds[r], &reports[r], sizeof(Report)) == sizeof(Report) && ok;
    close(fds[r]);
    int status = 0;
    waitpid(pids[r], &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) {
    std::cerr << run.name << ": a rank failed\n";
    std::exit(1);
  }
  return reports;
}

double MaxOf(const std::vector<Report>& rs, double Report::*field) {
  double m = 0;
  for (const Report& r : rs) m = std::max(m, r.*field);
  return m;
}

// The step and one-rank modes' model: 32.5M parameters (hidden 512, 4 layers, MLP 2048, vocab
// 16384, untied).
trainctl::model::Qwen2VLConfig StepConfig() { return MakeConfig(512, 4, 2048, 16384); }

void StepMode() {
  const auto config = StepConfig();
  const int steps = absl::GetFlag(FLAGS_steps);
  const auto one = RunRanks(config, {"1 rank", 1, 0, 4, steps, true});
  const auto s0 = RunRanks(config, {"stage 0 x2", 2, 0, 2, steps, true});
  const auto s3 = RunRanks(config, {"stage 3 x2", 2, 3, 2, steps, true});
  const auto one3 = RunRanks(config, {"stage 3 x1", 1, 3, 4, steps, true});
  const double p = one[0].text_params;
  absl::PrintF(
      "step time, global batch 4 x %d tokens, P(text) = %.1fM, fp32, 1 thread per rank, the "
      "trainer's heap (peak RSS includes the freed memory it keeps)\n",
      absl::GetFlag(FLAGS_seq), p / 1e6);
  absl::PrintF("  1 rank, stage 0      %8.3f s\n", one[0].median_step_s);
  absl::PrintF("  1 rank, stage 3      %8.3f s   (peak RSS %.0f MB; stage 0: %.0f MB)\n",
               one3[0].median_step_s, one3[0].peak_rss / 1e6, one[0].peak_rss / 1e6);
  absl::PrintF("  ratio stage 3 / stage 0 (1 rank):  %.3f\n",
               one3[0].median_step_s / one[0].median_step_s);
  absl::PrintF("  2 ranks, stage 0     %8.3f s\n", MaxOf(s0, &Report::median_step_s));
  absl::PrintF("  2 ranks, stage 3     %8.3f s\n", MaxOf(s3, &Report::median_step_s));
  absl::PrintF("  ratio stage 3 / stage 0 (2 ranks): %.2f\n",
               MaxOf(s3, &Report::median_step_s) / MaxOf(s0, &Report::median_step_s));
  absl::PrintF("  ratio stage 3 (2 ranks) / 1 rank:  %.2f\n",
               MaxOf(s3, &Report::median_step_s) / one[0].median_step_s);
  absl::PrintF(
      "  2 ranks, stage 3: blocked in collectives %.3f s per step; the same collectives alone "
      "%.3f s (exposed / alone %.2f); stage 0's all-reduce wait %.3f s\n",
      MaxOf(s3, &Report::wait_per_step_s), MaxOf(s3, &Report::collectives_alone_s),
      MaxOf(s3, &Report::wait_per_step_s) / MaxOf(s3, &Report::collectives_alone_s),
      MaxOf(s0, &Report::wait_per_step_s));
  const double theory = 3.0 * p * 4 * (2 - 1) / 2;
  absl::PrintF(
      "bytes sent per step per rank at stage 3: %.1f MB; theoretical 3*P*(W-1)/W: %.1f MB;"
      " ratio %.2f\n",
      MaxOf(s3, &Report::bytes_per_step) / 1e6, theory / 1e6,
      MaxOf(s3, &Report::bytes_per_step) / theory);
  absl::PrintF(
      "  (Gloo has no reduce-scatter: its fallback all-reduces, twice the bytes of one)\n");
}

// Stage 3 against stage 0 on one rank, --rounds times in alternation (a fresh process each), each
// --steps steps: the ratio of each round's medians, and the median ratio. One run of each, as the
// step mode does, swings by ±10% on this noisy VM; pairs taken back to back share its mood.
void OneRankMode() {
  const auto config = StepConfig();
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> ratios;
  absl::PrintF("stage 3 / stage 0 on 1 rank, batch 4 x %d tokens, fp32, 1 thread, %d steps each:\n",
               absl::GetFlag(FLAGS_seq), steps);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const double s0 = RunRanks(config, {"stage 0 x1", 1, 0, 4, steps, true})[0].median_step_s;
    const double s3 = RunRanks(config, {"stage 3 x1", 1, 3, 4, steps, true})[0].median_step_s;
    ratios.push_back(s3 / s0);
    absl::PrintF("  round %d: stage 0 %.3f s, stage 3 %.3f s, ratio %.3f\n", round, s0, s3,
                 s3 / s0);
  }
  std::sort(ratios.begin(), ratios.end());
  absl::PrintF("  median ratio stage 3 / stage 0 (1 rank): %.3f (target <= 1.05)\n",
               ratios[ratios.size() / 2]);
}

void MemoryMode() {
  // ~150M parameters: hidden 768, 12 layers, MLP 3072, vocab 32000, untied.
  const auto config = MakeConfig(768, 12, 3072, 32000);
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_worlds), ',')) {
    int world = 0;
    if (!absl::SimpleAtoi(w, &world) || world < 1) continue;
    const auto s0 = RunRanks(config, {"stage 0", world, 0, 1, 1});
    const auto s3 = RunRanks(config, {"stage 3", world, 3, 1, 1});
    const double a = MaxOf(s0, &Report::peak_rss), b = MaxOf(s3, &Report::peak_rss);
    absl::PrintF(
        "peak RSS per rank, %d ranks, P = %.1fM: stage 0 %.0f MB, stage 3 %.0f MB, "
        "ratio %.2f (aim <= %.2f)\n",
        world, s0[0].text_params / 1e6, a / 1e6, b / 1e6, b / a, world == 2 ? 0.6 : 0.35);
  }
}

// The head's loss over --seq x 4 tokens of Qwen's 151,936-word vocabulary (hidden 512), forward
// and backward, unfused (logits in full, upcast to fp32) against fused in chunks
// (HeadCrossEntropy), each in its own process: peak resident memory and time.
void LossMode() {
  auto config = MakeConfig(512, 1, 1024, 151936);
  config.tie_word_embeddings = true;
  const int seq = absl::GetFlag(FLAGS_seq);
  struct Figures {
    double peak_rss = 0, seconds = 0, loss = 0;
  };
  auto measure = [&](bool fused) {
    int fd[2];
    if (pipe(fd) != 0) std::exit(1);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      mallopt(M_MMAP_THRESHOLD, 1 << 20);
      torch::manual_seed(1);
      trainctl::model::Qwen2VLForConditionalGeneration net(config);
      const torch::Tensor hidden = torch::randn({4 * seq, 512}, torch::requires_grad());
      const torch::Tensor labels = torch::randint(0, config.vocab_size, {4 * seq});
      const auto start = std::chrono::steady_clock::now();
      const torch::Tensor loss =
          fused ? net.HeadCrossEntropy(hidden, labels)
                : torch::nn::functional::cross_entropy(
                      net.Head(hidden).to(torch::kFloat32), labels,
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      loss.backward();
      Figures f;
      f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      f.loss = loss.item<double>();
      f.peak_rss = static_cast<double>(trainctl::PeakRssBytes());
      if (write(fd[1], &f, sizeof(f)) != sizeof(f)) _exit(1);
      _exit(0);
    }
    close(fd[1]);
    Figures f;
    const bool ok = read(fd[0], &f, sizeof(f)) == sizeof(f);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(1);
    return f;
  };
  const Figures unfused = measure(false), fused = measure(true);
  absl::PrintF("head loss over %d tokens x vocab 151936 (hidden 512), forward + backward:\n",
               4 * seq);
  absl::PrintF("  unfused (full fp32 logits): peak RSS %6.0f MB, %.2f s, loss %.4f\n",
               unfused.peak_rss / 1e6, unfused.seconds, unfused.loss);
  absl::PrintF("  fused, chunked:             peak RSS %6.0f MB, %.2f s, loss %.4f\n",
               fused.peak_rss / 1e6, fused.seconds, fused.loss);
  absl::PrintF("  ratio fused / unfused: peak RSS %.2f, time %.2f\n",
               fused.peak_rss / unfused.peak_rss, fused.seconds / unfused.seconds);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "loss") LossMode();
  if (mode == "step" || mode == "all") StepMode();
  if (mode == "one_rank") OneRankMode();
  if (mode == "memory" || mode == "all") MemoryMode();
  return 0;
}
