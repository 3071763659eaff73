// `trainctl-trainer serve --model DIR --listen HOST:PORT [--max_batch N] [--batch_window_ms MS]
// [--served_model_name NAME] [--image_root DIR] [--max_tokens N] [--device ..] [--dtype ..]
// [--attention ..] [--request_timeout_s S] [--read_timeout_s S]`: loads the HF model directory
// (its tokenizer.json, generation_config.json's eos and pad ids as `generate` reads them) and
// serves it OpenAI-style (openai_server.h) until SIGINT or SIGTERM, which stops accepting, ends
// requests in flight with 503 at the next decoding step and returns. --request_timeout_s (600):
// a request's deadline from arrival to its last token (504 past it); --read_timeout_s (30): how
// long a request may take to arrive from its first byte. Port 0 picks a free port; the first line
// on stdout is "serving NAME on http://HOST:PORT" once it listens.
#ifndef TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_
#define TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_

#include <map>
#include <string>

namespace trainctl::serve {

// The verb: 0 after a signal-initiated shutdown, 2 for bad flags, 1 when the model, tokenizer or
// address cannot be had (the reason on stderr).
int RunServe(const std::map<std::string, std::string>& flags);

}  // namespace trainctl::serve

#endif  // TRAINCTL_WORKER_TRAINER_SERVE_SERVE_TOOL_H_
