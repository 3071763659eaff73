// An OpenAI-compatible HTTP server over one model (cpp-httplib): `POST /v1/chat/completions`
// (chat_request.h says what a request may hold), `GET /v1/models`, and `GET /health`
// ({"status": "ok", "running_rows", "queued_rows"}). Handlers parse and build
// the prompt on the HTTP threads, then wait for the generation queue's single model thread.
//
// Answers: {"id": "chatcmpl-…", "object": "chat.completion", "created", "model", "choices":
// [{"index", "message": {"role": "assistant", "content"}, "finish_reason": "stop" | "length",
// "logprobs": null, "token_ids": [...]}], "usage": {"prompt_tokens", "completion_tokens",
// "total_tokens"}}. "token_ids" (an extension, as vLLM's) are the generated ids, eos included.
// The content is the tokens decoded without special tokens, cut before the first stop sequence
// (finish_reason "stop"), which is as far as OpenAI's servers go.
//
// Errors are OpenAI's object {"error": {"message", "type", "param", "code"}}: 400
// invalid_request_error for anything wrong with the request, 404 for an unknown model or path,
// 413 for a body over max_body_bytes; server_error for the server's own failures: 500 when the
// model fails (a LibTorch or allocator error), 504 (code "timeout") past the request timeout, 503
// while shutting down.
//
// Connections (common/http_server.h): a request must arrive whole within read_timeout of its
// first byte, a pool of up to http_threads threads serves connections (a few slow sockets take a
// few threads), and a handler whose client disconnects cancels its rows. Stop() stops accepting,
// fails what is queued or generating with 503 "the server is shutting down" at the next decoding
// step, and returns once every connection has ended.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_OPENAI_SERVER_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_OPENAI_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "worker/trainer/serve/chat_request.h"
#include "worker/trainer/serve/generation_queue.h"

namespace trainctl::http {
class BoundedServer;
}

namespace trainctl::serve {

struct OpenAiServerOptions {
  std::string model_name;  // what /v1/models lists and requests must name (or omit)
  RequestLimits limits;
  size_t max_body_bytes = size_t{64} << 20;
  int http_threads = 64;                            // connections served at once
  absl::Duration read_timeout = absl::Seconds(30);  // a whole request, from its first byte
};

// Thread-safe after Start; `tokenizer` and `queue` must outlive the server.
class OpenAiServer {
 public:
  OpenAiServer(const tokenizer::BpeTokenizer* tokenizer, GenerationQueue* queue,
               OpenAiServerOptions options);
  ~OpenAiServer();  // Stop()s
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds host:port (port 0: any free port) and serves on a background thread. Returns the bound
  // port; UNAVAILABLE when the address cannot be bound.
  absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops accepting, shuts the queue down (requests in flight end with 503) and joins the
  // serving thread once every connection has ended. Idempotent.
  void Stop();

 private:
  void Route();

  const tokenizer::BpeTokenizer* const tokenizer_;
  GenerationQueue* const queue_;
  const OpenAiServerOptions options_;
  std::atomic<int64_t> next_id_{1};
  std::unique_ptr<http::BoundedServer> http_;
  std::thread thread_;
};

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_OPENAI_SERVER_H_
