#include "worker/trainer/serve/openai_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/http_server.h"
#include "nlohmann/json.hpp"

namespace trainctl::serve {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";

std::string Dump(const json& doc) {
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendError(httplib::Response& res, int status, const std::string& message,
               const std::string& type, const std::string& param, const std::string& code) {
  json error = {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}};
  res.status = status;
  res.set_content(Dump(json{{"error", error}}), kJson);
}

void SendStatus(httplib::Response& res, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      SendError(res, 400, std::string(status.message()), "invalid_request_error",
                ErrorParam(status), "");
      break;
    case absl::StatusCode::kNotFound:
      SendError(res, 404, std::string(status.message()), "invalid_request_error",
                ErrorParam(status), "model_not_found");
      break;
    case absl::StatusCode::kDeadlineExceeded:
      SendError(res, 504, std::string(status.message()), "server_error", "", "timeout");
      break;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
      SendError(res, 503, std::string(status.message()), "server_error", "", "");
      break;
    default:
      SendError(res, 500, std::string(status.message()), "server_error", "", "");
  }
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The assistant's text of `tokens`: special tokens and ids outside the tokenizer (the model's
// embedding may be larger) left out, as HF's decode does.
std::string ChoiceText(const tokenizer::BpeTokenizer& tokenizer,
                       const std::vector<int64_t>& tokens) {
  std::vector<int32_t> ids;
  for (const int64_t t : tokens) {
    if (t >= 0 && t < tokenizer.vocab_size()) ids.push_back(static_cast<int32_t>(t));
  }
  absl::StatusOr<std::string> text = tokenizer.Decode(ids, /*skip_special_tokens=*/true,
                                                      /*drop_unknown_ids=*/true);
  return text.ok() ? *text : std::string();
}

http::ServerLimits Limits(const OpenAiServerOptions& options) {
  http::ServerLimits limits;
  limits.max_threads = options.http_threads;
  limits.request_read_timeout = options.read_timeout;
  return limits;
}

// OpenAI's error object for httplib's own failures (body too large, unknown path) and for a
// handler that throws.
void SetOpenAiErrorHandlers(http::BoundedServer& server) {
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 413) {
          SendError(res, 413, "the request body is too large", "invalid_request_error", "", "");
        } else if (res.status == 404) {
          SendError(res, 404, absl::StrCat("no route ", req.method, " ", req.path),
                    "invalid_request_error", "", "unknown_url");
        } else {
          SendError(res, res.status, absl::StrCat("HTTP ", res.status), "invalid_request_error", "",
                    "");
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, 500, "internal error", "server_error", "", "");
      });
}

// The answer's "choices" for `choices`, each cut before the first of `stop`; adds the tokens
// they generated to `completion_tokens`.
json ChatChoicesJson(const tokenizer::BpeTokenizer& tokenizer, const std::vector<Choice>& choices,
                     const std::vector<std::string>& stop, int64_t* completion_tokens) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    *completion_tokens += static_cast<int64_t>(c.tokens.size());
    std::string text = ChoiceText(tokenizer, c.tokens);
    bool stopped = c.eos;
    size_t cut = std::string::npos;
    for (const std::string& sequence : stop) cut = std::min(cut, text.find(sequence));
    if (cut != std::string::npos) {
      text.resize(cut);
      stopped = true;
    }
    out_choices.push_back({{"index", i},
                           {"message", {{"role", "assistant"}, {"content", text}}},
                           {"finish_reason", stopped ? "stop" : "length"},
                           {"logprobs", nullptr},
                           {"token_ids", c.tokens}});
  }
  return out_choices;
}

}  // namespace

OpenAiServer::OpenAiServer(const tokenizer::BpeTokenizer* tokenizer, GenerationQueue* queue,
                           OpenAiServerOptions options)
    : tokenizer_(tokenizer),
      queue_(queue),
      options_(std::move(options)),
      http_(std::make_unique<http::BoundedServer>(Limits(options_))) {
  Route();
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::Route() {
  http_->set_payload_max_length(options_.max_body_bytes);
  // Without it, Nagle's algorithm holds a keep-alive connection's small responses back ~40 ms.
  http_->set_tcp_nodelay(true);
  SetOpenAiErrorHandlers(*http_);

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {
        {"id", options_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "trainctl"}};
    res.set_content(Dump(json{{"object", "list"}, {"data", json::array({model})}}), kJson);
  });

  // Liveness and load, as vLLM's /health: rows decoding and rows waiting to join.
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Dump(json{{"status", "ok"},
                              {"running_rows", queue_->running_rows()},
                              {"queued_rows", queue_->queued_rows()}}),
                    kJson);
  });

  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<ChatRequest> request = ParseChatRequest(req.body, options_.limits);
    if (!request.ok()) return SendStatus(res, request.status());
    if (!request->model.empty() && request->model != options_.model_name) {
      return SendError(res, 404,
                       absl::StrCat("The model '", request->model, "' does not exist (this server ",
                                    "serves '", options_.model_name, "')"),
                       "invalid_request_error", "model", "model_not_found");
    }
    absl::StatusOr<ChatPrompt> prompt = BuildChatPrompt(*request, *tokenizer_, options_.limits);
    if (!prompt.ok()) return SendStatus(res, prompt.status());
    const int64_t prompt_tokens = static_cast<int64_t>(prompt->ids.size());
    // The client going away (its socket closed) cancels the rows at the next decoding step.
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    auto future = queue_->Submit(std::make_shared<const ChatPrompt>(*std::move(prompt)),
                                 request->sampling, cancelled);
    while (future.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (!*cancelled && http::BoundedServer::PeerClosed()) *cancelled = true;
    }
    absl::StatusOr<std::vector<Choice>> choices = future.get();
    if (!choices.ok()) return SendStatus(res, choices.status());

    int64_t completion_tokens = 0;
    const json out_choices =
        ChatChoicesJson(*tokenizer_, *choices, request->sampling.stop, &completion_tokens);
    const json body = {{"id", absl::StrFormat("chatcmpl-%016x", next_id_.fetch_add(1))},
                       {"object", "chat.completion"},
                       {"created", UnixSeconds()},
                       {"model", options_.model_name},
                       {"choices", out_choices},
                       {"usage",
                        {{"prompt_tokens", prompt_tokens},
                         {"completion_tokens", completion_tokens},
                         {"total_tokens", prompt_tokens + completion_tokens}}}};
    res.set_content(Dump(body), kJson);
  });
}

absl::StatusOr<int> OpenAiServer::Start(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = http_->bind_to_any_port(host);
  } else if (!http_->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  }
  http_->RaiseBacklog();
  auto ended = std::make_shared<std::atomic<bool>>(false);
  thread_ = std::thread([this, ended] {
    http_->listen_after_bind();
    *ended = true;
  });
  // stop() does nothing until the accept loop runs, so Stop() could not end it before; the socket
  // already listens, so connections made meanwhile wait in the backlog.
  while (!http_->is_running() && !*ended)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  return bound;
}

void OpenAiServer::Stop() {
  if (!thread_.joinable()) return;
  http_->Shutdown();
  queue_->Shutdown();
  thread_.join();
}

}  // namespace trainctl::serve
