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

// The flags that say what to serve where, how to batch and how long requests may take.
struct ServeFlags {
  std::string model_dir, host;
  int port = -1;
  int64_t max_batch = 16, window_ms = 2, max_tokens = 256;
  int64_t request_timeout_s = 600, read_timeout_s = 30;
};

// --model, --listen, the batching and the timeout flags into `out`; 0, or 2 after printing what
// is wrong.
int ParseServeFlags(const std::map<std::string, std::string>& flags, ServeFlags* out) {
  out->model_dir = Flag(flags, "model");
  const std::string listen = Flag(flags, "listen");
  const size_t colon = listen.rfind(':');
  if (out->model_dir.empty() || colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &out->port) || out->port < 0 ||
      out->port > 65535) {
    return Fail(2, "--model DIR and --listen HOST:PORT are required");
  }
  out->host = listen.substr(0, colon);
  if (!PositiveFlag(flags, "max_batch", &out->max_batch) || out->max_batch > 1024) {
    return Fail(2, "--max_batch: an integer in [1, 1024]");
  }
  if (flags.count("batch_window_ms") &&
      (!absl::SimpleAtoi(Flag(flags, "batch_window_ms"), &out->window_ms) || out->window_ms < 0)) {
    return Fail(2, "--batch_window_ms: a non-negative integer");
  }
  if (!PositiveFlag(flags, "max_tokens", &out->max_tokens)) {
    return Fail(2, "--max_tokens: a positive integer");
  }
  if (!PositiveFlag(flags, "request_timeout_s", &out->request_timeout_s)) {
    return Fail(2, "--request_timeout_s: a positive integer (seconds)");
  }
  if (!PositiveFlag(flags, "read_timeout_s", &out->read_timeout_s)) {
    return Fail(2, "--read_timeout_s: a positive integer (seconds)");
  }
  return 0;
}

// The image and body limits of `options`: the model's preprocessor config, then --min_pixels,
// --max_pixels and --max_body_mb; 0, or 2 after printing what is wrong.
int ParseServeLimitFlags(const std::map<std::string, std::string>& flags,
                         const std::string& model_dir, OpenAiServerOptions* options) {
  // HF's processor semantics: min_pixels/max_pixels bound smart_resize's area; the model's
  // preprocessor_config.json sets them as AutoProcessor.from_pretrained reads it (else Qwen2-VL's
  // 3136 and 12845056, as trainctl prepare's), and the flags override it as the kwargs do.
  absl::StatusOr<data::ImageProcessorOptions> processor = data::ReadPreprocessorConfig(model_dir);
  if (!processor.ok()) return Fail(2, std::string(processor.status().message()));
  options->limits.image = *processor;
  data::ImageProcessorOptions& image = options->limits.image;
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
  int64_t max_body_mb = static_cast<int64_t>(options->max_body_bytes >> 20);
  if (!PositiveFlag(flags, "max_body_mb", &max_body_mb) || max_body_mb > 4096) {
    return Fail(2, "--max_body_mb: an integer in [1, 4096]");
  }
  options->max_body_bytes = static_cast<size_t>(max_body_mb) << 20;
  return 0;
}

// SIGINT and SIGTERM blocked in the calling thread; returns them, for sigwait.
sigset_t BlockServeStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The HF model of `model_dir` on `forward`'s device, attention and dtype, in eval mode; 0, or 1
// after printing why it could not be loaded.
int LoadServeModel(const std::string& model_dir, const model::ForwardOptions& forward,
                   std::shared_ptr<model::Qwen2VLForConditionalGeneration>* model) {
  try {
    absl::StatusOr<std::shared_ptr<model::Qwen2VLForConditionalGeneration>> loaded =
        model::LoadHfModel(model_dir, forward.dtype);
    if (!loaded.ok()) return Fail(1, std::string(loaded.status().message()));
    *model = *std::move(loaded);
    (*model)->to(forward.device);
    (*model)->SetAttentionImpl(forward.attention);
    (*model)->eval();
  } catch (const c10::Error& e) {
    return Fail(1, e.what_without_backtrace());
  }
  return 0;
}

// The generation queue's batching and deadline from the flags, its eos and pad ids from the
// model directory as `generate` reads them.
GenerationQueueOptions ServeQueueOptions(const ServeFlags& serve) {
  const trainer::SpecialTokens special = trainer::ReadSpecialTokens(serve.model_dir);
  GenerationQueueOptions queue_options;
  queue_options.max_batch = serve.max_batch;
  queue_options.batch_window = absl::Milliseconds(serve.window_ms);
  queue_options.eos_token_ids = special.eos_token_ids;
  queue_options.pad_token_id = special.pad_token_id;
  queue_options.request_timeout = absl::Seconds(serve.request_timeout_s);
  return queue_options;
}

// The served model's name, the request defaults and the HTTP pool of `options`, given the
// model's context length.
void SetServeServerOptions(const std::map<std::string, std::string>& flags, const ServeFlags& serve,
                           int64_t max_context, OpenAiServerOptions* options) {
  options->model_name = Flag(flags, "served_model_name");
  if (options->model_name.empty()) {
    const std::filesystem::path dir = std::filesystem::path(serve.model_dir).lexically_normal();
    options->model_name = dir.filename().string();
    if (options->model_name.empty()) options->model_name = dir.parent_path().filename().string();
  }
  options->limits.image_root = Flag(flags, "image_root");
  options->limits.max_tokens_default = serve.max_tokens;
  options->limits.max_context = max_context;
  // A handler thread waits for its rows, so a full batch needs max_batch of them; keep-alive
  // connections and slow clients (cut off read_timeout after their first byte) hold one each.
  options->http_threads =
      static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(64, 4 * serve.max_batch)));
  options->read_timeout = absl::Seconds(serve.read_timeout_s);
}

}  // namespace

int RunServe(const std::map<std::string, std::string>& flags) {
  ServeFlags serve;
  if (const int code = ParseServeFlags(flags, &serve)) return code;
  OpenAiServerOptions options;
  if (const int code = ParseServeLimitFlags(flags, serve.model_dir, &options)) return code;
  absl::StatusOr<model::ForwardOptions> forward = model::ParseForwardOptions(
      Flag(flags, "device"), Flag(flags, "dtype"), Flag(flags, "attention"));
  if (!forward.ok()) return Fail(2, std::string(forward.status().message()));

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t signals = BlockServeStopSignals();

  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tokenizer =
      tokenizer::BpeTokenizer::Load(serve.model_dir);
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));
  std::shared_ptr<model::Qwen2VLForConditionalGeneration> model;
  if (const int code = LoadServeModel(serve.model_dir, *forward, &model)) return code;

  GenerationQueue queue(model, ServeQueueOptions(serve));
  SetServeServerOptions(flags, serve, model->config().max_position_embeddings, &options);
  OpenAiServer server(tokenizer->get(), &queue, options);
  absl::StatusOr<int> bound = server.Start(serve.host, serve.port);
  if (!bound.ok()) return Fail(1, std::string(bound.status().message()));
  std::cout << "serving " << options.model_name << " on http://" << serve.host << ":" << *bound
            << std::endl;
  int signal = 0;
  sigwait(&signals, &signal);
  std::cerr << "trainctl-trainer serve: signal " << signal << ", stopping\n";
  server.Stop();
  return 0;
}

}  // namespace trainctl::serve
