#include "worker/trainer/serve/serve_tool.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/data/preprocessor_config.h"
#include "worker/trainer/generate_tool.h"
#include "worker/trainer/model/forward_tool.h"
#include "worker/trainer/model/state_dict_adapter.h"
#include "worker/trainer/serve/openai_server.h"

namespace trainctl::serve {
namespace {

std::string Flag(const std::map<std::string, std::string>& flags, const char* name) {
  auto it = flags.find(name);
  return it == flags.end() ? std::string() : it->second;
}

int Fail(int code, const std::string& message) {
  std::cerr << "trainctl-trainer serve: " << message << "\n";
  return code;
}

bool PositiveFlag(const std::map<std::string, std::string>& flags, const char* name,
                  int64_t* value) {
  if (!flags.count(name)) return true;
  return absl::SimpleAtoi(Flag(flags, name), value) && *value > 0;
}

}  // namespace

int RunServe(const std::map<std::string, std::string>& flags) {
  const std::string model_dir = Flag(flags, "model"), listen = Flag(flags, "listen");
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (model_dir.empty() || colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return Fail(2, "--model DIR and --listen HOST:PORT are required");
  }
  const std::string host = listen.substr(0, colon);
  int64_t max_batch = 16, window_ms = 2, max_tokens = 256;
  if (!PositiveFlag(flags, "max_batch", &max_batch) || max_batch > 1024) {
    return Fail(2, "--max_batch: an integer in [1, 1024]");
  }
  if (flags.count("batch_window_ms") &&
      (!absl::SimpleAtoi(Flag(flags, "batch_window_ms"), &window_ms) || window_ms < 0)) {
    return Fail(2, "--batch_window_ms: a non-negative integer");
  }
  if (!PositiveFlag(flags, "max_tokens", &max_tokens)) {
    return Fail(2, "--max_tokens: a positive integer");
  }
  int64_t request_timeout_s = 600, read_timeout_s = 30;
  if (!PositiveFlag(flags, "request_timeout_s", &request_timeout_s)) {
    return Fail(2, "--request_timeout_s: a positive integer (seconds)");
  }
  if (!PositiveFlag(flags, "read_timeout_s", &read_timeout_s)) {
    return Fail(2, "--read_timeout_s: a positive integer (seconds)");
  }
  // HF's processor semantics: min_pixels/max_pixels bound smart_resize's area; the model's
  // preprocessor_config.json sets them as AutoProcessor.from_pretrained reads it (else Qwen2-VL's
  // 3136 and 12845056, as trainctl prepare's), and the flags override it as the kwargs do.
  OpenAiServerOptions options;
  absl::StatusOr<data::ImageProcessorOptions> processor = data::ReadPreprocessorConfig(model_dir);
  if (!processor.ok()) return Fail(2, std::string(processor.status().message()));
  options.limits.image = *processor;
  data::ImageProcessorOptions& image = options.limits.image;
  if (!PositiveFlag(flags, "min_pixels", &image.min_pixels)) {
    return Fail(2, "--min_pixels: a positive integer");
  }
  if (!PositiveFlag(flags, "max_pixels", &image.max_pixels)) {
    return Fail(2, "--max_pixels: a positive integer");
  }
  if (image.max_pixels < image.min_pixels) {
    return Fail(2, absl::StrCat("--max_pixels (", image.max_pixels,
                                ") must be at least --min_pixels (", image.min_pixels, ")"));
  }
  int64_t max_body_mb = static_cast<int64_t>(options.max_body_bytes >> 20);
  if (!PositiveFlag(flags, "max_body_mb", &max_body_mb) || max_body_mb > 4096) {
    return Fail(2, "--max_body_mb: an integer in [1, 4096]");
  }
  options.max_body_bytes = static_cast<size_t>(max_body_mb) << 20;
  absl::StatusOr<model::ForwardOptions> forward = model::ParseForwardOptions(
      Flag(flags, "device"), Flag(flags, "dtype"), Flag(flags, "attention"));
  if (!forward.ok()) return Fail(2, std::string(forward.status().message()));

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tokenizer =
      tokenizer::BpeTokenizer::Load(model_dir);
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> model;
  try {
    absl::StatusOr<std::shared_ptr<model::Qwen2VLForConditionalGeneration>> loaded =
        model::LoadHfModel(model_dir, forward->dtype);
    if (!loaded.ok()) return Fail(1, std::string(loaded.status().message()));
    model = *std::move(loaded);
    model->to(forward->device);
    model->SetAttentionImpl(forward->attention);
    model->eval();
  } catch (const c10::Error& e) {
    return Fail(1, e.what_without_backtrace());
  }

  const trainer::SpecialTokens special = trainer::ReadSpecialTokens(model_dir);
  GenerationQueueOptions queue_options;
  queue_options.max_batch = max_batch;
  queue_options.batch_window = absl::Milliseconds(window_ms);
  queue_options.eos_token_ids = special.eos_token_ids;
  queue_options.pad_token_id = special.pad_token_id;
  queue_options.request_timeout = absl::Seconds(request_timeout_s);
  GenerationQueue queue(model, queue_options);

  options.model_name = Flag(flags, "served_model_name");
  if (options.model_name.empty()) {
    options.model_name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (options.model_name.empty()) {
      options.model_name =
          std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
    }
  }
  options.limits.image_root = Flag(flags, "image_root");
  options.limits.max_tokens_default = max_tokens;
  options.limits.max_context = model->config().max_position_embeddings;
  // A handler thread waits for its rows, so a full batch needs max_batch of them; keep-alive
  // connections and slow clients (cut off read_timeout after their first byte) hold one each.
  options.http_threads =
      static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(64, 4 * max_batch)));
  options.read_timeout = absl::Seconds(read_timeout_s);
  OpenAiServer server(tokenizer->get(), &queue, options);
  absl::StatusOr<int> bound = server.Start(host, port);
  if (!bound.ok()) return Fail(1, std::string(bound.status().message()));
  std::cout << "serving " << options.model_name << " on http://" << host << ":" << *bound
            << std::endl;
  int signal = 0;
  sigwait(&signals, &signal);
  std::cerr << "trainctl-trainer serve: signal " << signal << ", stopping\n";
  server.Stop();
  return 0;
}

}  // namespace trainctl::serve
