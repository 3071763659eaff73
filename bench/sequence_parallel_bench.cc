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
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/mesh_bench.h"

ABSL_FLAG(std::string, lengths, "1024,2048,4096", "prompt lengths in words (about one token each)");
ABSL_FLAG(int, steps, 3, "steps per run (the first is not timed)");
ABSL_FLAG(std::string, work, "/tmp/sequence_parallel_bench", "scratch folder");

namespace {

namespace fs = std::filesystem;
namespace bench = trainctl::bench;

// Tiny's sizes (configs/models/tiny): 2 layers, hidden 64, intermediate 128, 2 key/value heads
// of 16.
constexpr bench::ModelSizes kTiny = {2, 64, 128, 2, 16};

// Runs sp ranks of tiny at `words` and reads rank 0's events.
bench::RankEvents Run(const std::string& work, const std::string& shards, int words, int sp,
                      int steps) {
  bench::MeshRun run;
  run.name = absl::StrCat("sp", sp, "-", words);
  run.model = "tiny";
  run.shards = shards;
  run.parallelism = {{"sequence_parallel_size", sp}};
  run.world = sp;
  run.words = words;
  run.steps = steps;
  run.port_base = 29611;
  return bench::RunSftRanks(work, run);
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
    const std::string shards = bench::PrepareLongPrompts(work, words);
    double base = 0;
    for (int sp : {1, 2, 4}) {
      const bench::RankEvents r = Run(work, shards, words, sp, steps);
      if (sp == 1) base = r.peak_above_states;
      const double model = bench::SequenceModelBytes(kTiny, sp, static_cast<int64_t>(r.row_tokens));
      absl::PrintF("%8d %3d %10.3f %14.1f %10.3f %14.0f %14.0f %8.3f\n", words, sp, r.step_seconds,
                   r.peak_above_states / (1 << 20), base > 0 ? r.peak_above_states / base : 0,
                   r.sequence_bytes_per_step, model,
                   model > 0 ? r.sequence_bytes_per_step / model : 0);
    }
  }
  return 0;
}
