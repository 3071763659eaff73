#include "worker/trainer/stages/internal/endpoint_teacher.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

#ifdef TRAINCTL_WITH_HTTPLIB
#include <httplib.h>
#endif

namespace trainctl::trainer::internal {
namespace {

using nlohmann::json;

#ifdef TRAINCTL_WITH_HTTPLIB

constexpr size_t kMaxAnswerBytes = size_t{256} << 20;  // one response body
constexpr int64_t kMaxImageBytes = int64_t{64} << 20;  // one image file

// "http://host:port/v1" → origin "http://host:port" (what httplib::Client takes), prefix "/v1".
struct EndpointUrl {
  std::string origin;
  std::string prefix;
};

absl::StatusOr<EndpointUrl> ParseBaseUrl(const std::string& base_url) {
  const bool https = absl::StartsWith(base_url, "https://");
  if (!https && !absl::StartsWith(base_url, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("teacher endpoint '", base_url, "': expected http://HOST[:PORT]/PATH"));
  }
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
  if (https) {
    return absl::InvalidArgumentError(absl::StrCat(
        "teacher endpoint '", base_url, "': this build's cpp-httplib has no OpenSSL (https)"));
  }
#endif
  const size_t host_at = base_url.find("://") + 3;
  const size_t slash = base_url.find('/', host_at);
  EndpointUrl url;
  url.origin = base_url.substr(0, slash);
  url.prefix = slash == std::string::npos ? "" : base_url.substr(slash);
  while (!url.prefix.empty() && url.prefix.back() == '/') url.prefix.pop_back();
  if (url.origin.size() == host_at || url.origin.find_first_of(" ?#@") != std::string::npos ||
      url.prefix.find_first_of(" ?#") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("teacher endpoint '", base_url, "': expected http://HOST[:PORT]/PATH"));
  }
  return url;
}

// The MIME type an image's first bytes say; empty when they are none the servers decode.
std::string ImageMime(absl::string_view bytes) {
  if (absl::StartsWith(bytes, "\x89PNG\r\n\x1a\n")) return "image/png";
  if (absl::StartsWith(bytes, "\xff\xd8\xff")) return "image/jpeg";
  if (absl::StartsWith(bytes, "GIF87a") || absl::StartsWith(bytes, "GIF89a")) return "image/gif";
  if (bytes.size() >= 12 && absl::StartsWith(bytes, "RIFF") && bytes.substr(8, 4) == "WEBP") {
    return "image/webp";
  }
  if (absl::StartsWith(bytes, "BM")) return "image/bmp";
  return "";
}

absl::StatusOr<std::string> ImageDataUrl(const std::string& path, int64_t index) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("prompt ", index, ": cannot read image '", path, "'"));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxImageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("prompt ", index, ": image '", path,
                                                   "' is larger than ", kMaxImageBytes, " bytes"));
  }
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), size)) {
    return absl::DataLossError(absl::StrCat("prompt ", index, ": cannot read image '", path, "'"));
  }
  const std::string mime = ImageMime(bytes);
  if (mime.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt ", index, ": '", path,
                                                   "' is not a PNG, JPEG, GIF, WebP or BMP image"));
  }
  return absl::StrCat("data:", mime, ";base64,", absl::Base64Escape(bytes));
}

// OpenAI's messages for a prompt: text parts and image_url parts with the images inlined.
absl::StatusOr<json> MessagesJson(const TeacherPrompt& prompt) {
  json messages = json::array();
  size_t image = 0;
  for (const tokenizer::ChatMessage& message : prompt.messages) {
    json content = json::array();
    for (const tokenizer::ChatPart& part : message.content) {
      if (part.kind == tokenizer::ChatPart::Kind::kText) {
        content.push_back({{"type", "text"}, {"text", part.text}});
        continue;
      }
      if (image >= prompt.images.size()) {
        return absl::InvalidArgumentError(absl::StrCat("prompt ", prompt.index,
                                                       ": more image parts than its ",
                                                       prompt.images.size(), " images"));
      }
      absl::StatusOr<std::string> url = ImageDataUrl(prompt.images[image++], prompt.index);
      if (!url.ok()) return url.status();
      content.push_back({{"type", "image_url"}, {"image_url", {{"url", *std::move(url)}}}});
    }
    messages.push_back({{"role", message.role}, {"content", std::move(content)}});
  }
  if (image != prompt.images.size()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt ", prompt.index, ": ",
                                                   prompt.images.size(), " images for ", image,
                                                   " image parts"));
  }
  return messages;
}

// Bounds every wait of one Complete call: stops a slot's client once its request passes its
// deadline (so a server that trickles bytes cannot hold it either), and on Cancel stops them all
// and wakes every back-off sleep.
class RequestSupervisor {
 public:
  explicit RequestSupervisor(size_t slots) : slots_(slots), thread_([this] { Run(); }) {}
  ~RequestSupervisor() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }

  // False (and nothing armed) once cancelled.
  bool Arm(size_t slot, httplib::Client* client, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    slots_[slot] = {client, deadline, false};
    return true;
  }
  // Whether the deadline stopped the request.
  bool Disarm(size_t slot) {
    absl::MutexLock lock(&mu_);
    const bool fired = slots_[slot].fired;
    slots_[slot] = {};
    return fired;
  }
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (Slot& s : slots_) {
      if (s.client != nullptr) s.client->stop();
    }
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // Sleeps `d` unless cancelled first; false when cancelled.
  bool Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), d);
    return !cancelled_;
  }

 private:
  struct Slot {
    httplib::Client* client = nullptr;
    absl::Time deadline = absl::InfiniteFuture();
    bool fired = false;
  };

  void Run() {
    absl::MutexLock lock(&mu_);
    while (!done_) {
      absl::Time next = absl::InfiniteFuture();
      const absl::Time now = absl::Now();
      for (Slot& s : slots_) {
        if (s.client == nullptr || s.fired) continue;
        if (s.deadline <= now) {
          s.client->stop();
          s.fired = true;
        } else {
          next = std::min(next, s.deadline);
        }
      }
      // Woken early by done_; deadlines armed meanwhile are at least a timeout away, so a
      // 50 ms poll bounds how late they are noticed.
      mu_.AwaitWithDeadline(absl::Condition(&done_), std::min(next, now + absl::Milliseconds(50)));
    }
  }

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

struct EndpointConfig {
  EndpointTeacherOptions options;
  EndpointUrl url;
  httplib::Headers headers;
};

// One worker's keep-alive connection and the retry policy around it.
class RetryingClient {
 public:
  RetryingClient(const EndpointConfig& config, RequestSupervisor* supervisor, size_t slot)
      : config_(config), supervisor_(supervisor), slot_(slot), client_(config.url.origin) {
    const auto timeout = absl::ToChronoMicroseconds(absl::Seconds(config.options.timeout_seconds));
    client_.set_connection_timeout(timeout);
    client_.set_read_timeout(timeout);
    client_.set_write_timeout(timeout);
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);  // headers and body go as two writes: no Nagle stall between
  }

  // The 200 answer's body for `method` `path` (a POST when `body` is set). Retries 429, 5xx,
  // connection errors and timeouts; `what` ("prompt 3") starts every error message.
  absl::StatusOr<std::string> Call(const std::string& path, const std::optional<std::string>& body,
                                   const std::string& what) {
    const std::string url = config_.url.origin + config_.url.prefix + path;
    const std::string method = body ? "POST" : "GET";
    const int attempts = config_.options.max_retries + 1;
    for (int attempt = 1;; ++attempt) {
      if (supervisor_->cancelled()) return absl::CancelledError("cancelled");
      Outcome out = Send(method, config_.url.prefix + path, body);
      if (out.cancelled) return absl::CancelledError("cancelled");
      if (out.too_large) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what, ": ", method, " ", url, ": an answer larger than ", kMaxAnswerBytes, " bytes"));
      }
      if (out.status == 200) return std::move(out.body);
      const bool retryable = out.status == 0 || out.status == 429 || out.status >= 500;
      if (!retryable || attempt == attempts) {
        const std::string tries =
            attempts == 1 ? "" : absl::StrCat(" after ", attempt, " attempts");
        const std::string message =
            absl::StrCat(what, ": ", method, " ", url, ": ",
                         out.Describe(config_.options.timeout_seconds), tries);
        if (!retryable) return StatusForHttp(out.status, message);
        return out.timed_out ? absl::DeadlineExceededError(message)
                             : absl::UnavailableError(message);
      }
      const double nominal = std::min(
          config_.options.backoff_max_seconds,
          config_.options.backoff_initial_seconds * std::ldexp(1.0, std::min(attempt - 1, 60)));
      // Half fixed, half random: retries of many workers spread out, none comes too soon.
      double wait = nominal * absl::Uniform(gen_, 0.5, 1.0);
      if (out.retry_after) wait = std::min(*out.retry_after, config_.options.backoff_max_seconds);
      if (!supervisor_->Sleep(absl::Seconds(wait))) return absl::CancelledError("cancelled");
    }
  }

 private:
  struct Outcome {
    int status = 0;  // 0: no HTTP answer
    std::string body;
    std::string transport_error;
    bool timed_out = false;
    bool cancelled = false;
    bool too_large = false;
    std::optional<double> retry_after;

    std::string Describe(double timeout_seconds) const {
      if (timed_out) return absl::StrCat("no answer within the timeout of ", timeout_seconds, " s");
      if (status == 0) return absl::StrCat("connection failed (", transport_error, ")");
      std::string message;
      const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (doc.is_object() && doc.contains("error")) {
        const json& error = doc["error"];
        if (error.is_object() && error.contains("message") && error["message"].is_string()) {
          message = error["message"].get<std::string>();
        } else if (error.is_string()) {
          message = error.get<std::string>();
        }
      }
      if (message.empty()) message = body.substr(0, 300);
      return absl::StrCat("HTTP ", status, message.empty() ? "" : ": ", message);
    }
  };

  static absl::Status StatusForHttp(int status, const std::string& message) {
    switch (status) {
      case 400:
      case 413:
      case 422:
        return absl::InvalidArgumentError(message);
      case 401:
        return absl::UnauthenticatedError(message);
      case 403:
        return absl::PermissionDeniedError(message);
      case 404:
        return absl::NotFoundError(message);
      default:
        return absl::FailedPreconditionError(message);
    }
  }

  Outcome Send(const std::string& method, const std::string& path,
               const std::optional<std::string>& body) {
    httplib::Request req;
    req.method = method;
    req.path = path;
    req.headers = config_.headers;
    if (body) {
      req.body = *body;
      req.headers.emplace("Content-Type", "application/json");
    }
    Outcome out;
    req.content_receiver = [&](const char* data, size_t length, uint64_t, uint64_t) {
      if (out.body.size() + length > kMaxAnswerBytes) {
        out.too_large = true;
        return false;
      }
      out.body.append(data, length);
      return true;
    };
    const absl::Time deadline = absl::Now() + absl::Seconds(config_.options.timeout_seconds);
    if (!supervisor_->Arm(slot_, &client_, deadline)) {
      out.cancelled = true;
      return out;
    }
    httplib::Result result = client_.send(req);
    const bool fired = supervisor_->Disarm(slot_);
    if (out.too_large) return out;
    if (!result || fired) {
      out.timed_out =
          fired || absl::Now() >= deadline || result.error() == httplib::Error::ConnectionTimeout;
      out.transport_error = httplib::to_string(result.error());
      out.body.clear();
      return out;
    }
    out.status = result->status;
    if (result->has_header("Retry-After")) {
      double seconds = 0;
      if (absl::SimpleAtod(result->get_header_value("Retry-After"), &seconds) &&
          std::isfinite(seconds) && seconds >= 0) {
        out.retry_after = seconds;
      }
    }
    return out;
  }

  const EndpointConfig& config_;
  RequestSupervisor* supervisor_;
  size_t slot_;
  httplib::Client client_;
  absl::BitGen gen_;
};

absl::Status Malformed(int64_t index, const std::string& why) {
  return absl::InternalError(
      absl::StrCat("prompt ", index, ": the teacher endpoint's answer is malformed: ", why));
}

// Adds a chat completion's choices (up to `wanted` of them) to `answer`. A choice's token count
// is the length of its token_ids when the server gives them (trainctl serve does); otherwise
// usage.completion_tokens split evenly over the response's choices (exact with one choice).
absl::Status TakeChoices(const std::string& body, int64_t index, int64_t wanted,
                         TeacherAnswer& answer) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("choices") || !doc["choices"].is_array()) {
    return Malformed(index, "no \"choices\" array");
  }
  const json& choices = doc["choices"];
  if (choices.empty()) return Malformed(index, "no choices");
  int64_t total_tokens = 0;
  if (doc.contains("usage") && doc["usage"].is_object()) {
    const json& usage = doc["usage"];
    if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer()) {
      total_tokens = std::max<int64_t>(0, usage["completion_tokens"].get<int64_t>());
    }
    if (answer.completions.empty() && usage.contains("prompt_tokens") &&
        usage["prompt_tokens"].is_number_integer()) {
      answer.prompt_tokens = std::max<int64_t>(0, usage["prompt_tokens"].get<int64_t>());
    }
  }
  const int64_t count = static_cast<int64_t>(choices.size());
  for (int64_t i = 0; i < count && i < wanted; ++i) {
    const json& choice = choices[static_cast<size_t>(i)];
    const std::string where = absl::StrCat("choices[", i, "]");
    if (!choice.is_object() || !choice.contains("message") || !choice["message"].is_object()) {
      return Malformed(index, where + " has no message");
    }
    const json& message = choice["message"];
    TeacherCompletion completion;
    if (message.contains("content") && message["content"].is_string()) {
      completion.text = message["content"].get<std::string>();
    } else if (message.contains("content") && !message["content"].is_null()) {
      return Malformed(index, where + ".message.content is not a string");
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      completion.finish_reason = choice["finish_reason"].get<std::string>();
    }
    if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
      completion.completion_tokens = static_cast<int64_t>(choice["token_ids"].size());
    } else {
      completion.completion_tokens = total_tokens / count + (i < total_tokens % count ? 1 : 0);
    }
    answer.completions.push_back(std::move(completion));
  }
  return absl::OkStatus();
}

class EndpointTeacher final : public Teacher {
 public:
  explicit EndpointTeacher(EndpointConfig config) : config_(std::move(config)) {}

  std::string DescribeJson() const override {
    return json{
        {"kind", "endpoint"}, {"model", config_.options.model}, {"url", config_.options.base_url}}
        .dump(-1, ' ', false, json::error_handler_t::replace);
  }

  absl::StatusOr<std::vector<TeacherAnswer>> Complete(const std::vector<TeacherPrompt>& prompts,
                                                      const TeacherSampling& sampling) override {
    if (sampling.n < 1 || sampling.max_tokens < 1) {
      return absl::InvalidArgumentError("teacher sampling: n and max_tokens must be at least 1");
    }
    const size_t workers =
        std::min(prompts.size(), static_cast<size_t>(config_.options.concurrency));
    std::vector<absl::StatusOr<TeacherAnswer>> results(prompts.size(),
                                                       absl::CancelledError("not run"));
    RequestSupervisor supervisor(workers);
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        RetryingClient client(config_, &supervisor, w);
        for (size_t i = next++; i < prompts.size() && !supervisor.cancelled(); i = next++) {
          results[i] = CompletePrompt(client, prompts[i], sampling);
          if (!results[i].ok()) supervisor.Cancel();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<TeacherAnswer> answers;
    answers.reserve(prompts.size());
    for (auto& result : results) {  // the first real error, in prompt order
      if (!result.ok() && !absl::IsCancelled(result.status())) return result.status();
    }
    for (auto& result : results) {
      if (!result.ok()) return result.status();
      answers.push_back(*std::move(result));
    }
    return answers;
  }

 private:
  absl::StatusOr<TeacherAnswer> CompletePrompt(RetryingClient& client, const TeacherPrompt& prompt,
                                               const TeacherSampling& sampling) const {
    absl::StatusOr<json> messages = MessagesJson(prompt);
    if (!messages.ok()) return messages.status();
    json body = {{"model", config_.options.model},
                 {"messages", *std::move(messages)},
                 {"temperature", sampling.temperature},
                 {"top_p", sampling.top_p},
                 {"max_tokens", sampling.max_tokens}};
    if (sampling.top_k > 0) body["top_k"] = sampling.top_k;
    TeacherAnswer answer;
    answer.index = prompt.index;
    const std::string what = absl::StrCat("prompt ", prompt.index);
    for (uint64_t round = 0; static_cast<int64_t>(answer.completions.size()) < sampling.n;
         ++round) {
      const int64_t wanted = sampling.n - static_cast<int64_t>(answer.completions.size());
      const uint64_t seed =
          EndpointRequestSeed(sampling.seed, prompt.index, static_cast<int64_t>(round));
      body["n"] = wanted;
      body["seed"] = static_cast<int64_t>(seed);  // OpenAI's seed is a signed 64-bit integer
      // Text that is not UTF-8 goes as U+FFFD rather than throwing.
      absl::StatusOr<std::string> text = client.Call(
          "/chat/completions", body.dump(-1, ' ', false, json::error_handler_t::replace), what);
      if (!text.ok()) return text.status();
      if (absl::Status s = TakeChoices(*text, prompt.index, wanted, answer); !s.ok()) return s;
    }
    return answer;
  }

  EndpointConfig config_;
};

// The first model id of GET {base_url}/models.
absl::StatusOr<std::string> DiscoverModel(const EndpointConfig& config) {
  RequestSupervisor supervisor(1);
  RetryingClient client(config, &supervisor, 0);
  const std::string url = config.options.base_url + "/models";
  absl::StatusOr<std::string> body = client.Call("/models", std::nullopt, "model discovery");
  if (!body.ok()) return body.status();
  const json doc = json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("data") || !doc["data"].is_array() || doc["data"].empty() ||
      !doc["data"][0].is_object() || !doc["data"][0].contains("id") ||
      !doc["data"][0]["id"].is_string() || doc["data"][0]["id"].get<std::string>().empty()) {
    return absl::UnavailableError(absl::StrCat("model discovery: GET ", url,
                                               " lists no model (expected {\"data\": [{\"id\": "
                                               "...}]}); name one with the teacher's model"));
  }
  return doc["data"][0]["id"].get<std::string>();
}

#endif  // TRAINCTL_WITH_HTTPLIB

absl::Status CheckOptions(const EndpointTeacherOptions& o) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("teacher endpoint: ", what));
  };
  if (o.concurrency < 1 || o.concurrency > 1024) return bad("concurrency must be in [1, 1024]");
  if (!(o.timeout_seconds > 0) || o.timeout_seconds > 86400) {
    return bad("timeout_seconds must be in (0, 86400]");
  }
  if (o.max_retries < 0 || o.max_retries > 100) return bad("max_retries must be in [0, 100]");
  if (!(o.backoff_initial_seconds >= 0) || !(o.backoff_max_seconds >= 0) ||
      o.backoff_max_seconds > 86400) {
    return bad("back-off seconds must be in [0, 86400]");
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t EndpointRequestSeed(uint64_t seed, int64_t index, int64_t round) {
  uint64_t z = seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(round) * 0xD1B54A32D192ED03ull);
  z += 0x9E3779B97F4A7C15ull;  // SplitMix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) >> 1;
}

absl::StatusOr<std::unique_ptr<Teacher>> MakeEndpointTeacher(
    const EndpointTeacherOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
#ifdef TRAINCTL_WITH_HTTPLIB
  absl::StatusOr<EndpointUrl> url = ParseBaseUrl(options.base_url);
  if (!url.ok()) return url.status();
  EndpointConfig config;
  config.options = options;
  while (!config.options.base_url.empty() && config.options.base_url.back() == '/') {
    config.options.base_url.pop_back();
  }
  config.url = *std::move(url);
  if (!options.api_key.empty()) {
    config.headers.emplace("Authorization", absl::StrCat("Bearer ", options.api_key));
  }
  if (config.options.model.empty()) {
    absl::StatusOr<std::string> model = DiscoverModel(config);
    if (!model.ok()) return model.status();
    config.options.model = *std::move(model);
  }
  return std::make_unique<EndpointTeacher>(std::move(config));
#else
  return absl::UnimplementedError(
      "teacher_endpoint: this trainctl-trainer was built without cpp-httplib (the HTTP client); "
      "use teacher_model_name_or_path, or a build with libcpp-httplib-dev");
#endif
}

}  // namespace trainctl::trainer::internal
